"""Handoff throughput, side by side from one run: in-process edge, cross-process link, and baselines.

Run by hand (not collected by pytest), with stagevisor installed (`pip install -e '.[test]'`):

    python tests/benchmarks/bench_handoff.py [--quick]

For payloads from 256 B to 16 MiB (a float32 numpy tensor in a data dict) it
measures payloads per second over:

  link     the data-plane link between two spawned processes (codec + batched
           frames + shared memory for large tensors), as a cross-process edge uses it
  grpc     a plain gRPC bidi stream between two spawned processes, one message per payload
  pipe     a multiprocessing Pipe (send_bytes / recv_bytes) between two processes
  memcpy   one numpy copy of the payload in this process

and, separately, an in-process edge (a chain of stages run by StageRuntime)
against bare awaited calls of the same stages. It prints ratios for the
targets in the README performance table: small payloads over the link vs plain gRPC
messages/s (>= 3x), 16 MiB over the link vs memcpy bandwidth (>= 40%), and
in-process edges vs a bare call (within 2x).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np

SIZES = [256, 4096, 65536, 1 << 20, 16 << 20]
METHOD = "/bench.Raw/Stream"
AREA_ENV = "BENCH_SHM_AREA"
"""The shared-memory directory main() creates, for the spawned receiver."""


def count_for(size: int, quick: bool) -> int:
    budget = (64 << 20) if quick else (256 << 20)
    return int(max(50, min(20000 if not quick else 5000, budget // size)))


def payload_of(size: int) -> dict:
    return {"tensor": np.ones(size // 4, dtype=np.float32), "step": 1}


# ---- receivers (spawned processes) --------------------------------------------------


def link_receiver(address: str, ready) -> None:
    """Serves the DataPlane link; decodes every Submit; acknowledges the last with a Credit frame."""
    import grpc

    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from stagevisor.supervisor.dataplane import shm
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.link import GRPC_OPTIONS, serve_links

    codec = Codec(area=shm.SharedArea.open(Path(os.environ[AREA_ENV])))

    def on_frame(frame, link):
        if frame.WhichOneof("body") == "submit":
            data = codec.decode(frame.submit.data, link)
            assert data["tensor"].dtype == np.float32
            if frame.request_id == "last":
                link.reply(pb.Frame(request_id="last", credit=pb.Credit(chunks=1)))

    async def main():
        server = grpc.aio.server(options=GRPC_OPTIONS)
        serve_links(server, on_frame)
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def grpc_receiver(address: str, ready) -> None:
    """A plain bidi stream: one message per payload; answers once after the one marked last."""
    import grpc

    from stagevisor.supervisor.dataplane.link import GRPC_OPTIONS

    async def stream(request_iterator, context):
        async for message in request_iterator:
            array = np.frombuffer(message, dtype=np.float32)  # what a receiver of a raw tensor would do
            if len(message) and message[:1] == b"L":
                await context.write(b"ack")
            del array

    async def main():
        server = grpc.aio.server(options=GRPC_OPTIONS)
        handler = grpc.stream_stream_rpc_method_handler(stream, request_deserializer=None, response_serializer=None)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", {"Stream": handler}),))
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def pipe_receiver(conn, count: int) -> None:
    for _ in range(count):
        data = conn.recv_bytes()
        np.frombuffer(data, dtype=np.float32)
    conn.send_bytes(b"ack")


# ---- senders (this process) ----------------------------------------------------------


async def bench_link(address: str, size: int, count: int) -> float:
    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from stagevisor.supervisor.dataplane import shm
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.link import OutboundLink

    area = shm.SharedArea.open(Path(os.environ[AREA_ENV]))
    codec = Codec(area=area)
    acked = asyncio.Event()

    def on_reply(frame):
        acked.set()

    link = OutboundLink(address, "bench", on_reply, lambda link, error: acked.set(), buffers=codec)
    request = {"text": "benchmark", "options": {}}
    data = payload_of(size)

    async def send(request_id: str) -> None:
        frame = pb.Frame(request_id=request_id, src="a", dst="b")
        codec.encode_into(request, frame.submit.request)
        codec.encode_into(data, frame.submit.data)
        out = codec.take_out_of_line()
        await link.send_async(frame, out)
        if out.segments:
            await asyncio.sleep(0)  # as StageRuntime does: lets released buffers come back

    for _ in range(8):  # warm up: the link, and the buffer pool to its steady state
        await send("warmup")
    started = time.perf_counter()
    for index in range(count - 1):
        await send("r")
    await send("last")
    await acked.wait()
    elapsed = time.perf_counter() - started
    await link.close()
    codec.close()
    area.close()
    return count / elapsed


async def bench_grpc(address: str, size: int, count: int) -> float:
    import grpc

    from stagevisor.supervisor.dataplane.link import CHANNEL_OPTIONS

    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)()
        array = payload_of(size)["tensor"]
        await call.write(b"w" + array.tobytes()[1:])
        started = time.perf_counter()
        for _ in range(count - 1):
            await call.write(array.tobytes())
        await call.write(b"L" + array.tobytes()[1:])
        await call.read()
        elapsed = time.perf_counter() - started
        call.cancel()
    return count / elapsed


def bench_pipe(size: int, count: int) -> float:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=pipe_receiver, args=(child, count), daemon=True)
    process.start()
    array = payload_of(size)["tensor"]
    started = time.perf_counter()
    for _ in range(count):
        parent.send_bytes(memoryview(array).cast("B"))
    parent.recv_bytes()
    elapsed = time.perf_counter() - started
    process.join(30)
    return count / elapsed


def bench_memcpy(size: int, count: int) -> float:
    source = payload_of(size)["tensor"]
    target = np.empty_like(source)
    started = time.perf_counter()
    for _ in range(count):
        np.copyto(target, source)
    return count / (time.perf_counter() - started)


# ---- in-process edge ----------------------------------------------------------------


class PassThrough:
    async def process(self, payload, ctx):
        return payload.data


async def bench_in_process(stages: int, count: int) -> tuple[float, float]:
    """Seconds per request through a chain of `stages` PassThrough stages: (runtime, bare awaited calls)."""
    from stagevisor.stages.base import StagePayload
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.runtime import Invocation, StageRuntime, _RequestState
    from stagevisor.supervisor.plan import PlannedStage

    names = [f"s{i}" for i in range(stages)]
    planned = {
        n: PlannedStage(name=n, process="p", gpu=None, tp_size=1, total_gpu_memory_fraction=None,
                        fraction_source=None, factory=None, next=tuple(names[i + 1:i + 2]))
        for i, n in enumerate(names)
    }
    executors = {n: PassThrough() for n in names}
    runtime = StageRuntime(planned, executors, {}, "unix:/unused", "bench", Codec())

    class NullLink:
        async def send_async(self, frame, out=None):
            pass

    null = NullLink()

    class NullLinks:
        def get(self, address):
            return null

    runtime.links = NullLinks()
    data = payload_of(256)
    request = {"text": "x"}

    started = time.perf_counter()
    for index in range(count):
        state = _RequestState(str(index))
        await runtime._run(Invocation(runtime, state, names[0], StagePayload(state.request_id, request, data), None))
    edge_time = (time.perf_counter() - started) / count

    started = time.perf_counter()
    for index in range(count):
        payload = StagePayload(str(index), request, data)
        for name in names:
            payload = StagePayload(payload.request_id, request, await executors[name].process(payload, None))
    bare_time = (time.perf_counter() - started) / count
    return edge_time, bare_time


# ---- driver ---------------------------------------------------------------------------


def spawn_server(target, address: str):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(address, ready), daemon=True)
    process.start()
    if not ready.wait(60):
        raise SystemExit(f"{target.__name__} did not start")
    return process


def human(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def main() -> int:
    parser = argparse.ArgumentParser(description="data-plane handoff benchmark")
    parser.add_argument("--quick", action="store_true", help="fewer payloads per size")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(dir="/tmp", prefix="bh")
    from stagevisor.supervisor.dataplane import shm

    area = shm.SharedArea.create(shm.new_area_path())  # the daemon's private directory, as a gateway makes it
    os.environ[AREA_ENV] = str(area.path)  # the spawned receiver inherits it
    link_address, grpc_address = f"unix:{workdir}/link.sock", f"unix:{workdir}/grpc.sock"
    servers = [spawn_server(link_receiver, link_address), spawn_server(grpc_receiver, grpc_address)]
    try:
        print(f"handoff throughput, payloads/s (2 processes for link, grpc, pipe); cpus={os.cpu_count()}, "
              f"load average {os.getloadavg()[0]:.2f}")
        print(f"{'payload':>8} {'n':>6} {'link':>10} {'grpc':>10} {'pipe':>10} {'memcpy':>10}  "
              f"{'link/grpc':>9} {'link/pipe':>9} {'link/memcpy':>11} {'link MB/s':>10}")

        async def cross_process(size: int, count: int) -> tuple[float, float]:
            return await bench_link(link_address, size, count), await bench_grpc(grpc_address, size, count)

        async def in_process(count: int) -> tuple[float, float, float, float]:
            long_edge, long_bare = await bench_in_process(10, count)
            short_edge, short_bare = await bench_in_process(2, count)
            return long_edge, long_bare, short_edge, short_bare

        loop = asyncio.new_event_loop()  # one loop for every gRPC measurement
        for size in SIZES:
            count = count_for(size, args.quick)
            link, plain = loop.run_until_complete(cross_process(size, count))
            pipe = bench_pipe(size, count)
            memcpy = bench_memcpy(size, max(count, 50))
            print(f"{human(size):>8} {count:>6} {link:>10.0f} {plain:>10.0f} {pipe:>10.0f} {memcpy:>10.0f}  "
                  f"{link / plain:>8.2f}x {link / pipe:>8.2f}x {link / memcpy:>10.1%} {link * size / 1e6:>10.0f}")
        count = 20000 if not args.quick else 5000
        long_edge, long_bare, short_edge, short_bare = loop.run_until_complete(in_process(count))
        loop.close()
        # Per edge: the difference between a 10-stage and a 2-stage chain, over the 8 extra edges,
        # so per-request costs (admission, the completion report) cancel out.
        edge = (long_edge - short_edge) / 8
        bare = (long_bare - short_bare) / 8
        print(f"\nin-process edge ({count} requests through chains of 10 and 2 stages): "
              f"{edge * 1e6:.2f} us per handoff via StageRuntime vs {bare * 1e6:.2f} us per bare awaited "
              f"call -> {edge / bare:.2f}x a bare call")
        print(f"(whole requests: 10-stage chain {1 / long_edge:.0f} req/s via the runtime, "
              f"{1 / long_bare:.0f} req/s as bare calls)")
    finally:
        for process in servers:
            process.kill()
        area.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
