"""Experiment (not product code): link frames over an asyncio unix socket instead of gRPC, against a raw pipe.

Run by hand, with stagevisor installed:

    python tests/benchmarks/experiment_raw_link.py [--repeats 3]

It asks whether the gRPC transport is what keeps small handoffs short of a
raw `multiprocessing` Pipe (README, "Small-frame handoffs"). The sender and
receiver use the link's own pieces (packed values from the codec,
`frame_bytes`, `parse_batch`, a CreditWindow of the in-flight size, one
Credit per stream per received batch), but the batches travel length-prefixed
on a unix stream socket read and written by asyncio protocol callbacks: no
gRPC threads, and whatever is queued goes out at the end of the loop
iteration it was queued in (no timers). Each configuration runs `--repeats`
times interleaved with the pipe (bench_handoff's `bench_pipe`), and it prints
medians [min-max] of payloads/s and of CPU per payload of both processes.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_handoff as bh  # noqa: E402 - the pipe baseline and payloads, from the same directory

_HEADER = struct.Struct("<I")


class _Protocol(asyncio.Protocol):
    """Length-prefixed batches; `push` queues a frame, flushed once at the end of this loop iteration."""

    def __init__(self, on_batch) -> None:
        self.on_batch = on_batch
        self.buffer = bytearray()
        self.pending: list[bytes] = []
        self.scheduled = False
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        position, available = 0, len(self.buffer)
        while available - position >= 4:
            (size,) = _HEADER.unpack_from(self.buffer, position)
            if position + 4 + size > available:
                break
            self.on_batch(bytes(self.buffer[position + 4 : position + 4 + size]), self)
            position += 4 + size
        del self.buffer[:position]

    def push(self, data: bytes) -> None:
        self.pending.append(data)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        body, self.pending = b"".join(self.pending), []
        self.transport.write(_HEADER.pack(len(body)) + body)


def raw_receiver(path: str, ready) -> None:
    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.link.frames import frame_bytes, parse_batch

    codec = Codec()

    def on_batch(data: bytes, protocol: _Protocol) -> None:
        frames, _ = parse_batch(data)
        credits: dict[tuple[str, str, str], int] = {}
        for frame in frames:
            if frame.WhichOneof("body") == "chunk":
                codec.decode(frame.chunk.value)
                key = (frame.request_id, frame.src, frame.dst)
                credits[key] = credits.get(key, 0) + 1
        for (request_id, src, dst), chunks in credits.items():
            protocol.push(
                frame_bytes(pb.Frame(request_id=request_id, src=src, dst=dst, credit=pb.Credit(chunks=chunks)))
            )

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(lambda: _Protocol(on_batch), path)
        ready.set()
        await server.serve_forever()

    asyncio.run(main())


async def raw_sender(path: str, size: int, count: int, in_flight: int) -> float:
    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.link.frames import frame_bytes, parse_batch
    from stagevisor.supervisor.dataplane.streams import CreditWindow

    codec = Codec()
    window = CreditWindow(in_flight)

    def on_batch(data: bytes, protocol: _Protocol) -> None:
        frames, _ = parse_batch(data)
        for frame in frames:
            if frame.WhichOneof("body") == "credit":
                window.release(frame.credit.chunks)

    _, protocol = await asyncio.get_running_loop().create_unix_connection(lambda: _Protocol(on_batch), path)
    data = bh.payload_of(size)

    async def send() -> None:
        await window.acquire()
        frame = pb.Frame(request_id="r", src="a", dst="b")
        codec.encode_into(data, frame.chunk.value)
        codec.take_out_of_line()
        protocol.push(frame_bytes(frame))

    async def settle() -> None:
        while window.credits < in_flight:
            window._available.clear()
            await window._available.wait()

    for _ in range(2 * in_flight + 8):  # warm up
        await send()
    await settle()
    started = time.perf_counter()
    for _ in range(count):
        await send()
    await settle()
    rate = count / (time.perf_counter() - started)
    protocol.transport.close()
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description="link frames over a raw unix socket vs a raw pipe")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="rawlink")
    path = f"{workdir}/raw.sock"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    receiver = ctx.Process(target=raw_receiver, args=(path, ready), daemon=True)
    receiver.start()
    if not ready.wait(60):
        raise SystemExit("raw_receiver did not start")
    pipe_process, pipe = bh.spawn_pipe()
    me = psutil.Process()
    peers = {"raw": psutil.Process(receiver.pid), "pipe": psutil.Process(pipe_process.pid)}
    rates: dict[tuple, list[float]] = {}
    cpu: dict[tuple, list[float]] = {}
    load_before = os.getloadavg()[0]
    try:
        for _ in range(args.repeats):
            for size in (256, 4096):
                for in_flight in (8, 64):
                    for system in ("raw", "pipe"):
                        before = sum(me.cpu_times()[:2]) + sum(peers[system].cpu_times()[:2])
                        if system == "raw":
                            rate = asyncio.run(raw_sender(path, size, args.count, in_flight))
                        else:
                            rate = bh.bench_pipe(pipe, size, args.count, in_flight)
                        after = sum(me.cpu_times()[:2]) + sum(peers[system].cpu_times()[:2])
                        rates.setdefault((system, size, in_flight), []).append(rate)
                        cpu.setdefault((system, size, in_flight), []).append((after - before) / args.count)
        print(
            f"raw unix-socket link vs raw pipe; cpus={os.cpu_count()}, load average {load_before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after; {args.repeats} interleaved repetitions, median [min-max]"
        )
        for size in (256, 4096):
            for in_flight in (8, 64):
                cells = []
                for system in ("raw", "pipe"):
                    r, c = rates[(system, size, in_flight)], cpu[(system, size, in_flight)]
                    cells.append(
                        f"{system} {statistics.median(r):.0f}/s [{min(r):.0f}-{max(r):.0f}] "
                        f"CPU {statistics.median(c) * 1e6:.0f} us"
                    )
                ratio = statistics.median(rates[("raw", size, in_flight)]) / statistics.median(
                    rates[("pipe", size, in_flight)]
                )
                print(f"{bh.human(size):>6} in flight {in_flight:>2}: {cells[0]}; {cells[1]}; raw/pipe {ratio:.2f}x")
    finally:
        bh.shut_down(pipe, (receiver, pipe_process), workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
