"""Small test executors and a spawned-worker harness for the data-plane integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from stagevisor.stages.base import InvalidRequest, StagePayload
from stagevisor.supervisor.plan import Edge, Plan, PlannedStage, ProcessGroup
from stagevisor.supervisor.worker.spec import WorkerSpec

SAMPLE_RATE = 16000


class Tokenize:
    """Entry stage: splits the text into words; rejects an unknown option like a real frontend."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        options = payload.request.get("options", {})
        if "bad" in options:
            raise InvalidRequest(f"option 'bad' is not supported (got {options['bad']!r})")
        return {"words": payload.request["text"].split(), "pid_tokenize": os.getpid()}


class Engine:
    """Streams one chunk per word (a small latent tensor), then returns the word count. The word `boom` fails it;
    `waitfor=PATH` holds it (up to 30 s) until PATH exists, a test's signal that it saw the audio before."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        words = payload.data["words"]
        for index, word in enumerate(words):
            if word == "boom":
                raise RuntimeError("engine exploded on purpose")
            if word.startswith("waitfor="):
                for _ in range(3000):
                    if Path(word.removeprefix("waitfor=")).exists():
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise RuntimeError(f"{word}: no such file after 30 s")
            latent = np.full((4, 8), float(len(word) + index), dtype=np.float32)
            await ctx.stream({"index": index, "latent": latent})
        return {"count": len(words), "pid_engine": os.getpid()}


class Vocoder:
    """Terminal: decodes each streamed latent into a little deterministic audio chunk."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        seen = 0
        async for chunk in ctx.chunks():
            assert chunk["index"] == seen, f"chunk {chunk['index']} arrived as number {seen}"
            seen += 1
            value = float(chunk["latent"].mean())
            audio = np.sin(np.arange(160, dtype=np.float32) * value / 50.0).astype(np.float32)
            await ctx.stream({"audio": audio, "sample_rate": SAMPLE_RATE})
        if payload.data.get("count") != seen:
            raise RuntimeError(f"final data says {payload.data.get('count')} chunks, received {seen}")
        return None


class Slow:
    """Waits forever unless cancelled; records the cancellation in a file named by the request."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def process(self, payload: StagePayload, ctx) -> dict:
        marker = payload.request["options"].get("marker_dir")
        if marker:
            Path(marker, f"{self.name}.started").touch()
        try:
            async for chunk in ctx.chunks():
                await ctx.stream(chunk)
            while True:
                await ctx.stream({"audio": np.zeros(16, np.float32), "sample_rate": SAMPLE_RATE})
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if marker:
                Path(marker, f"{self.name}.cancelled").touch()
            raise


class Firehose:
    """Terminal: streams audio chunks (3 s unless `samples` says otherwise) as fast as it may, counting them."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        options = payload.request["options"]
        counter = Path(options["marker_dir"], "produced")
        audio = np.full(int(options.get("samples", 48000)), 0.25, np.float32)
        produced = 0
        while not ctx.cancelled:
            await ctx.stream({"audio": audio, "sample_rate": SAMPLE_RATE})
            produced += 1
            counter.with_suffix(".tmp").write_text(str(produced))
            counter.with_suffix(".tmp").replace(counter)  # atomic: a reader never sees it half written
        return None


class Echo:
    """Passes `data` through untouched, adding the pid it ran in."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        return {**payload.data, f"pid_{id(self)}": os.getpid()}


class BlobSource:
    """Entry stage emitting a payload of the size named in the options (for large-payload tests)."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        size = int(payload.request["options"]["size"])
        tensor = np.arange(size // 4, dtype=np.float32).reshape(-1, 1024)
        blob = bytes(range(256)) * (size // 256)
        return {"tensor": tensor, "blob": blob}


class BlobSink:
    """Terminal checking the large payload arrived intact; streams one summary chunk."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        tensor, blob = payload.data["tensor"], payload.data["blob"]
        expected = np.arange(tensor.size, dtype=np.float32).reshape(tensor.shape)
        ok = (
            tensor.dtype == np.float32
            and np.array_equal(tensor, expected)
            and blob == bytes(range(256)) * (len(blob) // 256)
        )
        level = 0.5 if ok else -0.5
        await ctx.stream({"audio": np.full(8, level, np.float32), "sample_rate": tensor.shape[0]})
        return None


# ---- harness ------------------------------------------------------------------------

StageDecl = tuple[str, str, Sequence[str], Sequence[str]]
"""(name, process, next, stream_to)."""


def make_plan(decls: Sequence[StageDecl]) -> Plan:
    """A Plan for CPU stages placed as declared (no placement validation: the tests choose)."""
    stages = tuple(
        PlannedStage(
            name=n,
            process=p,
            gpu=None,
            tp_size=1,
            total_gpu_memory_fraction=None,
            fraction_source=None,
            factory=None,
            next=tuple(nx),
            stream_to=tuple(st),
        )
        for n, p, nx, st in decls
    )
    groups: dict[str, list[str]] = {}
    for stage in stages:
        groups.setdefault(stage.process, []).append(stage.name)
    process_of = {s.name: s.process for s in stages}
    edges = []
    for stage in stages:
        for kind, targets in (("next", stage.next), ("stream_to", stage.stream_to)):
            for dst in targets:
                edges.append(Edge(stage.name, dst, kind, process_of[stage.name] != process_of[dst], True))
    return Plan(
        model=None,
        model_path=None,
        changed=False,
        stages=stages,
        groups=tuple(ProcessGroup(g, tuple(s), None, None) for g, s in groups.items()),
        edges=tuple(edges),
        gpus=(),
    )


def run_node(spec: WorkerSpec, stage_factories: Mapping[str, tuple[Callable, dict]], ready) -> None:
    """Entry point of a spawned test worker: build the stages, serve, report ready, run until killed."""
    from stagevisor.supervisor.worker.endpoint import WorkerEndpoint

    async def main() -> None:
        stages = {s.name: stage_factories[s.name][0](**stage_factories[s.name][1]) for s in spec.stages}
        endpoint = WorkerEndpoint(spec, stages)
        await endpoint.start()
        ready.set()
        while os.getppid() == spec.parent_pid:
            await asyncio.sleep(0.2)
        await endpoint.stop(0)

    asyncio.run(main())


class Cluster:
    """Spawned workers for a plan, plus a Gateway and a public Synthesis server in this process."""

    def __init__(
        self, decls: Sequence[StageDecl], factories: Mapping[str, tuple[Callable, dict]], **gateway_options
    ) -> None:
        self.plan = make_plan(decls)
        self.gateway_options = gateway_options
        self.factories = dict(factories)
        self.dir = tempfile.mkdtemp(prefix="dp")
        self.routes = {s.name: f"unix:{self.dir}/{s.process}.sock" for s in self.plan.stages}
        self.sink = f"unix:{self.dir}/sink.sock"
        self.public = f"unix:{self.dir}/api.sock"
        self.processes: dict[str, multiprocessing.Process] = {}
        self.gateway = None
        self.server = None

    def spawn(self, group: str, timeout: float = 60.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        stages = tuple(s for s in self.plan.stages if s.process == group)
        spec = WorkerSpec(
            group=self.plan.group(group),
            stages=stages,
            model_path=None,
            address=f"unix:{self.dir}/{group}.sock",
            routes=self.routes,
            sink_address=self.sink,
            shm_dir=self.gateway.shm_dir,
            parent_pid=os.getpid(),
        )
        ready = ctx.Event()
        process = ctx.Process(target=run_node, args=(spec, self.factories, ready), daemon=True)
        process.start()
        if not ready.wait(timeout):
            process.kill()
            raise TimeoutError(f"worker {group} did not become ready in {timeout}s")
        self.processes[group] = process

    async def start(self) -> "Cluster":
        import grpc

        from stagevisor.supervisor.dataplane.gateway import Gateway
        from stagevisor.supervisor.dataplane.synthesis import add_synthesis_to_server

        self.gateway = Gateway(self.plan, self.routes, self.sink, **self.gateway_options)
        await self.gateway.start()  # creates the shared-memory directory the workers open
        for group in self.plan.groups:
            await asyncio.to_thread(self.spawn, group.name)
        self.server = grpc.aio.server()
        add_synthesis_to_server(lambda: self.gateway, self.server)
        self.server.add_insecure_port(self.public)
        await self.server.start()
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
        if self.gateway is not None:
            await self.gateway.stop(0)
        for process in self.processes.values():
            process.kill()
            process.join(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def channel(self):
        import grpc

        return grpc.aio.insecure_channel(self.public)


async def synthesize(channel, text: str, **options: str) -> list:
    """All AudioChunk messages of one Synthesize call."""
    from stagevisor.supervisor._proto import synthesis_pb2 as spb
    from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc

    stub = sgrpc.SynthesisStub(channel)
    call = stub.Synthesize(spb.SynthesizeRequest(text=text, options=options))
    return [chunk async for chunk in call]


async def poll_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.02) -> bool:
    """Bounded wait: True as soon as `predicate()` holds, False after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return predicate()


SPLIT_CHAIN = [
    ("tokenize", "pipeline", ["engine"], []),
    ("engine", "pipeline", ["vocoder"], ["vocoder"]),
    ("vocoder", "vocoder", [], []),
]
"""tokenize -> engine in one worker, streaming to the vocoder in another."""


@contextlib.contextmanager
def split_chain() -> Iterator[tuple[asyncio.AbstractEventLoop, Cluster]]:
    """A started SPLIT_CHAIN cluster on its own event loop, stopped on exit (for module fixtures)."""
    loop = asyncio.new_event_loop()
    cluster = loop.run_until_complete(
        Cluster(SPLIT_CHAIN, {"tokenize": (Tokenize, {}), "engine": (Engine, {}), "vocoder": (Vocoder, {})}).start()
    )
    try:
        yield loop, cluster
    finally:
        loop.run_until_complete(cluster.stop())
        loop.close()
