"""Handoff throughput, side by side from one run: the cross-process link against a raw pipe and memcpy.

Run by hand (not collected by pytest), with stagevisor installed (`pip install -e '.[test]'`):

    python tests/benchmarks/bench_handoff.py [--quick] [--repeats 5] [--in-flight 8 64]

For payloads from 256 B to 16 MiB (a float32 numpy tensor in a data dict) it
measures payloads per second between two spawned processes, every system with
the same number of payloads in flight (the sender waits for an acknowledgement
once that many are outstanding, and the receiver acknowledges each one it
consumed):

  link     the data-plane link (link/outbound.py: batched frames on one gRPC stream,
           codec.py, shm.py for large tensors) as a `stream_to` edge uses it:
           one Chunk frame per payload, a Credit per chunk taken (merged per
           batch), the sender waiting on a CreditWindow of the in-flight size
  link-tree  the same link with the codec's packed values off (every payload a
           Value message per node, as before packed.py): the codec's share
  pipe     a raw multiprocessing Pipe: send_bytes of the tensor's bytes, one
           empty message back per payload received
  grpc     a plain gRPC bidi stream: one message per payload, one back per payload
  memcpy   one numpy copy of the payload in this process (bandwidth reference)

Every configuration runs `--repeats` times, interleaved (every system once,
then all again), so drift on a shared machine hits them alike; cells are
medians with their min-max spread, and ratios are between medians of this
run. Beside payloads/s it prints the CPU time both processes spent per payload
(sender and receiver together, from their CPU clocks), which a busy machine
distorts far less than wall time; for memcpy, the CPU time of one copy, so
link/memcpy there says how many copies' worth of CPU a handoff costs. It ends
with the in-process edge against bare awaited calls.
Targets (README, issue 13): 256 B and 4 KiB over the link at least as many
payloads/s as the pipe (link/pipe >= 1.00x); 16 MiB at >= 60% of memcpy.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

SIZES = [256, 4096, 65536, 1 << 20, 16 << 20]
METHOD = "/bench.Raw/Stream"
AREA_ENV = "BENCH_SHM_AREA"
"""The shared-memory directory main() creates, for the spawned receiver."""


def count_for(size: int, quick: bool) -> int:
    budget = (48 << 20) if quick else (160 << 20)
    return int(max(40, min(3000 if quick else 8000, budget // size)))


def payload_of(size: int) -> dict:
    return {"tensor": np.ones(size // 4, dtype=np.float32), "step": 1}


# ---- receivers (spawned processes) --------------------------------------------------


def link_receiver(address: str, ready) -> None:
    """Serves the DataPlane link: decodes every Chunk and answers each with a Credit, as a stream receiver does."""
    import grpc

    from stagevisor.supervisor.dataplane import shm
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.link.outbound import GRPC_OPTIONS
    from stagevisor.supervisor.dataplane.link.server import serve_links

    codec = Codec(area=shm.SharedArea.open(Path(os.environ[AREA_ENV])))

    def on_frame(frame, link):
        if frame.WhichOneof("body") == "chunk":
            data = codec.decode(frame.chunk.value, link)
            assert data["tensor"].dtype == np.float32
            del data  # a pooled buffer is released here, as when a stage drops the array
            link.credit((frame.request_id, frame.src, frame.dst))  # as a ChunkQueue's on_consumed does

    async def main():
        server = grpc.aio.server(options=GRPC_OPTIONS)
        serve_links(server, on_frame)
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def grpc_receiver(address: str, ready) -> None:
    """A plain bidi stream: one message per payload, one empty message back per payload."""
    import grpc

    from stagevisor.supervisor.dataplane.link.outbound import GRPC_OPTIONS

    async def stream(request_iterator, context):
        async for message in request_iterator:
            np.frombuffer(message, dtype=np.float32)  # what a receiver of a raw tensor would do
            await context.write(b"")

    async def main():
        server = grpc.aio.server(options=GRPC_OPTIONS)
        handler = grpc.stream_stream_rpc_method_handler(stream, request_deserializer=None, response_serializer=None)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Raw", {"Stream": handler}),))
        server.add_insecure_port(address)
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


def pipe_receiver(conn, ready) -> None:
    """Acknowledges every message with an empty one; an empty message from the sender ends it."""
    ready.set()
    while True:
        data = conn.recv_bytes()
        if not data:
            return
        np.frombuffer(data, dtype=np.float32)
        conn.send_bytes(b"")


# ---- senders (this process) ----------------------------------------------------------


class LinkSender:
    """This process's end of the link, kept across measurements (the link is dialled once, like a worker's)."""

    def __init__(self, address: str, packed: bool = True) -> None:
        from stagevisor.supervisor.dataplane import shm
        from stagevisor.supervisor.dataplane.codec import Codec
        from stagevisor.supervisor.dataplane.link.outbound import OutboundLink

        self.area = shm.SharedArea.open(Path(os.environ[AREA_ENV]))
        self.codec = Codec(area=self.area, packed=packed)
        self.window = None
        self.link = OutboundLink(address, "bench", self._on_reply, self._on_broken, buffers=self.codec)

    def _on_reply(self, frame) -> None:
        if frame.WhichOneof("body") == "credit" and self.window is not None:
            self.window.release(frame.credit.chunks)

    def _on_broken(self, link, error) -> None:
        raise SystemExit(f"the benchmark link broke: {error!r}")

    async def warm_up(self, size: int, count: int, in_flight: int) -> None:
        """Send and await a few rounds first: the buffer pool reaches its steady state (not timed, no CPU counted)."""
        await self.run(size, min(count, 2 * in_flight + 8), in_flight)

    async def run(self, size: int, count: int, in_flight: int) -> float:
        from stagevisor.supervisor._proto import dataplane_pb2 as pb
        from stagevisor.supervisor.dataplane.streams import CreditWindow

        data = payload_of(size)
        window = self.window = CreditWindow(in_flight)
        codec, link = self.codec, self.link

        async def send(request_id: str) -> None:
            # What Emitter.stream_chunk and StageRuntime.send do for one chunk of a remote stream.
            await window.acquire()
            frame = pb.Frame(request_id=request_id, src="a", dst="b")
            codec.encode_into(data, frame.chunk.value)
            out = codec.take_out_of_line()
            await link.send_async(frame, out)
            if out.segments:
                await asyncio.sleep(0)

        started = time.perf_counter()
        for _ in range(count):
            await send("r")
        while window.credits < in_flight:  # every payload acknowledged
            window._available.clear()
            await window._available.wait()
        return count / (time.perf_counter() - started)

    async def close(self) -> None:
        await self.link.close()
        self.codec.close()
        self.area.close()


async def bench_grpc(channel, size: int, count: int, in_flight: int) -> float:
    call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)()
    array = payload_of(size)["tensor"]
    started = time.perf_counter()
    outstanding = 0
    for _ in range(count):
        if outstanding >= in_flight:
            await call.read()
            outstanding -= 1
        await call.write(array.tobytes())
        outstanding += 1
    for _ in range(outstanding):
        await call.read()
    elapsed = time.perf_counter() - started
    call.cancel()
    return count / elapsed


def bench_pipe(conn, size: int, count: int, in_flight: int) -> float:
    view = memoryview(payload_of(size)["tensor"]).cast("B")
    started = time.perf_counter()
    outstanding = 0
    for _ in range(count):
        if outstanding >= in_flight:
            conn.recv_bytes()
            outstanding -= 1
        conn.send_bytes(view)
        outstanding += 1
    for _ in range(outstanding):
        conn.recv_bytes()
    return count / (time.perf_counter() - started)


def bench_memcpy(size: int, count: int) -> float:
    source = payload_of(size)["tensor"]
    target = np.empty_like(source)
    np.copyto(target, source)
    started = time.perf_counter()
    for _ in range(count):
        np.copyto(target, source)
    return count / (time.perf_counter() - started)


# ---- in-process edge ----------------------------------------------------------------


class PassThrough:
    async def process(self, payload, ctx):
        return payload.data


def in_process_chain(stages: int):
    """A StageRuntime running a chain of `stages` PassThrough stages in one process, its frames sent nowhere."""
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.runtime import StageRuntime
    from stagevisor.supervisor.plan import PlannedStage

    names = [f"s{i}" for i in range(stages)]
    planned = {
        n: PlannedStage(
            name=n,
            process="p",
            gpu=None,
            tp_size=1,
            total_gpu_memory_fraction=None,
            fraction_source=None,
            factory=None,
            next=tuple(names[i + 1 : i + 2]),
        )
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
    return runtime, executors, names


async def time_in_process(chain, count: int) -> tuple[float, float]:
    """Seconds per request through one chain: (StageRuntime, the same stages as bare awaited calls)."""
    from stagevisor.stages.base import StagePayload
    from stagevisor.supervisor.dataplane.invocation import Invocation
    from stagevisor.supervisor.dataplane.request_state import RequestState

    runtime, executors, names = chain
    data = payload_of(256)
    request = {"text": "x"}
    started = time.perf_counter()
    for index in range(count):
        state = RequestState(str(index))
        await runtime.calls.run(
            Invocation(runtime.emitter, state, names[0], StagePayload(state.request_id, request, data), None)
        )
    edge_time = (time.perf_counter() - started) / count

    started = time.perf_counter()
    for index in range(count):
        payload = StagePayload(str(index), request, data)
        for name in names:
            payload = StagePayload(payload.request_id, request, await executors[name].process(payload, None))
    bare_time = (time.perf_counter() - started) / count
    return edge_time, bare_time


async def bench_in_process(count: int, rounds: int) -> tuple[float, float]:
    """Seconds per in-process edge: (via StageRuntime, as a bare awaited call).

    A chain of 10 stages minus a chain of 2, over the 8 extra edges, so per-request
    costs (admission, the completion report) cancel out. The two chains run in
    `rounds` short batches of `count` requests, interleaved, and each figure is the
    median over the rounds: on a shared machine a burst of other work spoils a
    few batches, not the figure (one long run per chain varied by 3x here).
    """
    chains = {stages: in_process_chain(stages) for stages in (10, 2)}
    edges, bares = [], []
    for _ in range(rounds):
        (long_edge, long_bare), (short_edge, short_bare) = [
            await time_in_process(chains[stages], count) for stages in (10, 2)
        ]
        edges.append((long_edge - short_edge) / 8)
        bares.append((long_bare - short_bare) / 8)
    return statistics.median(edges), statistics.median(bares)


# ---- driver ---------------------------------------------------------------------------


def spawn_server(target, address: str, *extra):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    process = ctx.Process(target=target, args=(address, ready, *extra), daemon=True)
    process.start()
    if not ready.wait(60):
        raise SystemExit(f"{target.__name__} did not start")
    return process


def spawn_pipe():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    ready = ctx.Event()
    process = ctx.Process(target=pipe_receiver, args=(child, ready), daemon=True)
    process.start()
    if not ready.wait(60):
        raise SystemExit("pipe_receiver did not start")
    return process, parent


def human(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def main() -> int:
    parser = argparse.ArgumentParser(description="data-plane handoff benchmark")
    parser.add_argument("--quick", action="store_true", help="fewer payloads per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (medians over them)")
    parser.add_argument(
        "--in-flight", type=int, nargs="+", default=[8, 64], help="payloads in flight (8: one stream's credit window)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="payload sizes in bytes")
    parser.add_argument("--systems", nargs="+", default=["link", "pipe", "grpc", "memcpy"])
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process edge measurement")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(dir="/tmp", prefix="bh")
    from stagevisor.supervisor.dataplane import shm

    area = shm.SharedArea.create(shm.new_area_path())  # the daemon's private directory, as a gateway makes it
    os.environ[AREA_ENV] = str(area.path)  # the spawned receiver inherits it
    link_address, grpc_address = f"unix:{workdir}/link.sock", f"unix:{workdir}/grpc.sock"
    processes = [spawn_server(link_receiver, link_address), spawn_server(grpc_receiver, grpc_address)]
    pipe_process, pipe = spawn_pipe()
    processes.append(pipe_process)
    receivers = {"link": processes[0], "link-tree": processes[0], "grpc": processes[1], "pipe": pipe_process}
    cpu: dict[tuple[str, int, int], list[float]] = {}
    loop = asyncio.new_event_loop()  # one loop for every gRPC measurement
    results: dict[tuple[str, int, int], list[float]] = {}
    load_before = os.getloadavg()
    try:
        import grpc

        from stagevisor.supervisor.dataplane.link.outbound import CHANNEL_OPTIONS

        async def setup():
            return (
                {"link": LinkSender(link_address), "link-tree": LinkSender(link_address, packed=False)},
                grpc.aio.insecure_channel(grpc_address, options=CHANNEL_OPTIONS),
            )

        senders, channel = loop.run_until_complete(setup())
        peers = {name: psutil.Process(process.pid) for name, process in receivers.items()}
        me = psutil.Process()
        configs = [(size, w) for size in args.sizes for w in args.in_flight]
        for repeat in range(args.repeats):
            for size, in_flight in configs:
                for system in args.systems:
                    count = count_for(size, args.quick)
                    peer = peers.get(system)
                    if system in senders:
                        loop.run_until_complete(senders[system].warm_up(size, count, in_flight))
                    before = (sum(me.cpu_times()[:2]), sum(peer.cpu_times()[:2]) if peer else 0.0)
                    if system in senders:
                        rate = loop.run_until_complete(senders[system].run(size, count, in_flight))
                    elif system == "grpc":
                        rate = loop.run_until_complete(bench_grpc(channel, size, count, in_flight))
                    elif system == "pipe":
                        rate = bench_pipe(pipe, size, count, in_flight)
                    elif system == "memcpy":
                        count = max(count, 50)
                        started_cpu = time.process_time()  # finer than psutil's clock ticks for tiny copies
                        rate = bench_memcpy(size, count)
                        memcpy_cpu = time.process_time() - started_cpu
                    else:
                        raise SystemExit(f"unknown system {system!r}")
                    results.setdefault((system, size, in_flight), []).append(rate)
                    after = (sum(me.cpu_times()[:2]), sum(peer.cpu_times()[:2]) if peer else 0.0)
                    spent = memcpy_cpu if system == "memcpy" else after[0] - before[0] + after[1] - before[1]
                    cpu.setdefault((system, size, in_flight), []).append(spent / count)
            print(
                f"repetition {repeat + 1}/{args.repeats} done (load average {os.getloadavg()[0]:.2f})", file=sys.stderr
            )
        for sender in senders.values():
            loop.run_until_complete(sender.close())
        loop.run_until_complete(channel.close())

        print(
            f"handoff throughput, payloads/s between 2 processes; cpus={os.cpu_count()}, load average "
            f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {args.repeats} interleaved "
            "repetitions, median [min-max]"
        )
        systems = [s for s in args.systems if s != "memcpy"]
        header = f"{'payload':>8} {'in flight':>9} " + "".join(f"{s:>26}" for s in systems)
        if "memcpy" in args.systems:
            header += f"{'memcpy':>12}"
        if "link" in args.systems:
            header += "".join(f" {'link/' + s:>11}" for s in args.systems if s != "link")
        print(header)
        for size, in_flight in configs:
            row = f"{human(size):>8} {in_flight:>9} "
            medians = {}
            for system in args.systems:
                median, low, high = spread(results[(system, size, in_flight)])
                medians[system] = median
                if system != "memcpy":
                    row += f"{median:>10.0f} [{low:.0f}-{high:.0f}]".rjust(26)
            if "memcpy" in medians:
                row += f"{medians['memcpy']:>12.0f}"
            if "link" in medians:
                for system in args.systems:
                    if system == "link":
                        continue
                    ratio = medians["link"] / medians[system]
                    row += f"{ratio:>10.1%} " if system == "memcpy" else f"{ratio:>10.2f}x"
            print(row)
        print("\nCPU per payload, both processes (memcpy: the one copy), microseconds: median [min-max]")
        systems = list(args.systems)
        print(
            f"{'payload':>8} {'in flight':>9} "
            + "".join(f"{s:>22}" for s in systems)
            + ("".join(f" {'link/' + s:>11}" for s in systems if s != "link") if "link" in systems else "")
        )
        for size, in_flight in configs:
            row = f"{human(size):>8} {in_flight:>9} "
            medians = {}
            for system in systems:
                median, low, high = spread(cpu[(system, size, in_flight)])
                medians[system] = median
                row += f"{median * 1e6:>8.1f} [{low * 1e6:.1f}-{high * 1e6:.1f}]".rjust(22)
            if "link" in medians:
                row += "".join(
                    f" {medians['link'] / medians[s]:>10.2f}x" if medians[s] else f" {'n/a':>11}"
                    for s in systems
                    if s != "link"
                )
            print(row)
        if "link" in args.systems and "memcpy" in args.systems:
            for size, in_flight in configs:
                if size >= 1 << 20:
                    link = spread(results[("link", size, in_flight)])[0]
                    print(
                        f"{human(size)} in flight {in_flight}: link {link * size / 1e6:.0f} MB/s, memcpy "
                        f"{spread(results[('memcpy', size, in_flight)])[0] * size / 1e6:.0f} MB/s"
                    )

        if not args.no_in_process:
            count, rounds = 500, 100 if args.quick else 200
            results_in_process = [loop.run_until_complete(bench_in_process(count, rounds)) for _ in range(args.repeats)]
            edges, bares = [e for e, _ in results_in_process], [b for _, b in results_in_process]
            ratios = [e / b for e, b in results_in_process]
            (edge, edge_low, edge_high), bare = spread(edges), statistics.median(bares)
            ratio, ratio_low, ratio_high = spread(ratios)
            print(
                f"\nin-process edge (chains of 10 and 2 stages, {rounds} interleaved batches of {count} requests, "
                f"median of {args.repeats} repeats): {edge * 1e6:.2f} us [{edge_low * 1e6:.2f}-{edge_high * 1e6:.2f}]"
                f" per handoff via StageRuntime vs {bare * 1e6:.2f} us per bare awaited call -> "
                f"{edge / bare:.2f}x a bare call (per repeat {ratio:.2f}x [{ratio_low:.2f}-{ratio_high:.2f}]; "
                "target <= 1.5x)"
            )
    finally:
        loop.close()
        shut_down(pipe, processes, workdir)
        area.remove()
    return 0


def shut_down(pipe, processes, workdir: str) -> None:
    """End a benchmark's pipe peer and processes and remove its socket directory."""
    try:
        pipe.send_bytes(b"")
    except OSError:
        pass
    for process in processes:
        process.kill()
    for name in os.listdir(workdir):
        os.unlink(os.path.join(workdir, name))
    os.rmdir(workdir)


if __name__ == "__main__":
    sys.exit(main())
