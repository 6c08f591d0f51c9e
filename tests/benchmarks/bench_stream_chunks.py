"""What counting an in-process stream's chunks costs (stagevisor_edge_chunks_total{transport="in_process"}).

Run by hand (not collected by pytest), with stagevisor installed (`pip install -e '.[test]'`):

    python tests/benchmarks/bench_stream_chunks.py [--rounds 101] [--requests 10] [--chunks 200]

A StageRuntime with metrics on runs stage `a`, which streams `--chunks` small chunks to stage `b` in the same
process (Emitter.stream_chunk's in-process branch: the chunk object put on b's ChunkQueue), `--requests` requests
per batch. Two variants, interleaved batch by batch so that drift on a shared machine hits both alike:

  counted    as the runtime runs: each chunk adds one to the edge's EdgeStats.chunks
  uncounted  the same runtime with each stream's EdgeStats taken off its queue (`queue.edge = None`), so the
             per-chunk `if out.edge is not None` test stays and the increment goes

It prints the median CPU seconds per chunk of each (this process's CPU clock, which other load on a shared
machine distorts far less than wall time), with the min-max over the rounds, and the median of the rounds'
differences: what the count adds to one in-process chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests.fakes


class Streams:
    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def process(self, payload, ctx):
        for index in range(self.chunks):
            await ctx.stream(index)
        return {}


class Drains:
    async def process(self, payload, ctx):
        async for _ in ctx.chunks():
            pass
        return {}


def runtime_of(chunks: int, counted: bool):
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.runtime import StageRuntime
    from stagevisor.supervisor.metrics.recorder import Recorder
    from stagevisor.supervisor.plan import PlannedStage

    def planned(name, **edges):
        return PlannedStage(name, "p", None, 1, None, None, None, **edges)

    stages = {"a": planned("a", next=("b",), stream_to=("b",)), "b": planned("b")}
    runtime = StageRuntime(
        stages, {"a": Streams(chunks), "b": Drains()}, {}, "unix:/unused", "bench", Codec(), Recorder("p", pid=1)
    )

    class NullLink:
        async def send_async(self, frame, out=None):
            pass

    class NullLinks:
        def get(self, address):
            return NullLink()

    runtime.links = NullLinks()
    if not counted:
        emitter = runtime.emitter
        open_stream = emitter._open_local_stream

        def uncounted(inv, dst):
            queue = open_stream(inv, dst)
            queue.edge = None
            return queue

        emitter._open_local_stream = uncounted
    return runtime


async def batch(runtime, requests: int, chunks: int) -> float:
    """CPU seconds per chunk over `requests` requests of `chunks` chunks each, one request at a time, each submitted as
    the gateway submits it (its decoding is per request, alike in both variants)."""
    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from tests.fakes import FakeInboundLink

    link = FakeInboundLink()
    started = time.process_time()
    for index in range(requests):
        frame = pb.Frame(request_id=str(index), src="", dst="a")
        runtime.codec.encode_into({"text": "x", "options": {}}, frame.submit.request)
        runtime.codec.encode_into({}, frame.submit.data)
        runtime.on_frame(frame, link)
        while runtime.requests.requests:
            await asyncio.sleep(0)
    return (time.process_time() - started) / (requests * chunks)


async def main(rounds: int, requests: int, chunks: int) -> None:
    runtimes = {"counted": runtime_of(chunks, True), "uncounted": runtime_of(chunks, False)}
    for runtime in runtimes.values():
        await batch(runtime, 5, chunks)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runtimes}
    for index in range(rounds):
        order = list(runtimes) if index % 2 == 0 else list(reversed(runtimes))
        for name in order:
            times[name].append(await batch(runtimes[name], requests, chunks))
    counted = runtimes["counted"].recorder.edges[("a", "b", "in_process")].chunks
    print(f"{rounds} rounds of {requests} requests x {chunks} chunks, interleaved; counted chunks: {counted}")
    for name, values in times.items():
        print(
            f"  {name:<9} {statistics.median(values) * 1e6:.3f} us CPU per chunk "
            f"({min(values) * 1e6:.3f}-{max(values) * 1e6:.3f})"
        )
    differences = [c - u for c, u in zip(times["counted"], times["uncounted"], strict=True)]
    print(
        f"  counting adds {statistics.median(differences) * 1e9:+.0f} ns per chunk "
        f"(median of the rounds' differences; {min(differences) * 1e9:+.0f} to {max(differences) * 1e9:+.0f})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--chunks", type=int, default=200)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.requests, options.chunks))
