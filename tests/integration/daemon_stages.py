"""Small stage executors for the daemon tests: they build fast, record what they were given, or fail."""

from __future__ import annotations

import os
from typing import Any

from stagevisor.stages.base import StagePayload, StageContext


class EchoStage:
    """Passes `data` through, tagged with the stage name and the pid that ran it."""

    def __init__(self, name: str, injected: dict[str, Any]) -> None:
        self.name = name
        self.injected = injected

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        return {**payload.data, self.name: os.getpid()}


def make_echo(
    name: str = "echo",
    model_path: str | None = None,
    gpu_id: int | None = None,
    total_gpu_memory_fraction: float | None = None,
) -> EchoStage:
    """Accepts every injected value, so the tests see what the worker passed."""
    return EchoStage(
        name, {"model_path": model_path, "gpu_id": gpu_id, "total_gpu_memory_fraction": total_gpu_memory_fraction}
    )


async def make_async_echo(name: str = "echo") -> EchoStage:
    """An async factory that accepts none of the injected values."""
    return EchoStage(name, {})


class StageBuildBoom(RuntimeError):
    """The exception a deliberately broken stage raises while it builds."""


def make_broken(name: str = "broken", reason: str = "weights not found") -> EchoStage:
    raise StageBuildBoom(reason)


def make_crash_on_build(name: str = "crash") -> EchoStage:
    """Kills its own process while building, as a segfaulting native extension would."""
    os._exit(3)


def make_hanging(name: str = "hang") -> EchoStage:
    """Never finishes building, like a model load stuck on a dead network share."""
    import time

    while True:
        time.sleep(1)


def make_hanging_once_marked(name: str = "hang") -> EchoStage:
    """Builds at once until the file HANG_MARKER names exists, then never finishes building: a worker started
    later (a restart, a scale) loads a model forever while the first one serves."""
    import time

    marker = os.environ["HANG_MARKER"]
    while os.path.exists(marker):
        time.sleep(1)
    return EchoStage(name, {})


def make_crash_once_marked(name: str = "crash") -> EchoStage:
    """Builds until the file CRASH_MARKER names exists, then kills its process while building (a worker started
    later: a scale, a restart, an apply)."""
    if os.path.exists(os.environ["CRASH_MARKER"]):
        os._exit(3)
    return EchoStage(name, {})


class MemoryHog(EchoStage):
    """Echo that keeps `options["hog_mib"]` MiB of touched (resident) memory for as long as it lives."""

    held: list = []

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        mib = int(payload.request.get("options", {}).get("hog_mib", "0"))
        if mib:
            self.held.append(b"\x01" * (mib * 1024 * 1024))  # written bytes: resident, not just reserved
        return await super().process(payload, ctx)


def make_hog(name: str = "hog") -> MemoryHog:
    return MemoryHog(name, {})


def make_tokenize(name: str = "tokenize"):
    from tests.integration.dataplane_stages import Tokenize

    return Tokenize()


def make_engine(name: str = "engine"):
    """Streams one latent chunk per word of the text to the next stage."""
    from tests.integration.dataplane_stages import Engine

    return Engine()


def make_vocoder(name: str = "vocoder"):
    """Terminal: one small audio chunk per latent chunk it receives."""
    from tests.integration.dataplane_stages import Vocoder

    return Vocoder()


class Talker:
    """Entry stage: streams one chunk per word of the text, a few milliseconds apart."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        import asyncio

        words = payload.request["text"].split()
        for word in words:
            await ctx.stream({"word": word})
            await asyncio.sleep(0.005)
        return {"count": len(words)}


class Speaker:
    """Terminal stage: 10 ms of audio per word; the word `block` blocks its event loop for good.

    `block` stands for a synchronous call in process() that never returns
    (a blocking open on a dead share, a lock taken twice): the process stays
    alive, its sockets stay open, and it answers nothing.
    """

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        import time

        import numpy as np

        async for chunk in ctx.chunks():
            if chunk["word"] == "block":
                while True:
                    time.sleep(3600)
            await ctx.stream({"audio": np.full(160, 0.25, np.float32), "sample_rate": 16000})
        return None


class HoldingSpeaker(Speaker):
    """Speaker whose word `hold` makes it hold the request for an hour (its worker says so to the daemon every few
    seconds), after writing its pid to the file HOLD_MARKER names: the test knows which replica holds it."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        import asyncio

        import numpy as np

        async for chunk in ctx.chunks():
            if chunk["word"] == "hold":
                with open(os.environ["HOLD_MARKER"], "w") as marker:
                    marker.write(str(os.getpid()))
                await asyncio.sleep(3600)
            await ctx.stream({"audio": np.full(160, 0.25, np.float32), "sample_rate": 16000})
        return None


_RELAYED: dict[str, Any] = {}
"""Request id -> an asyncio.Event the relay sets once it has streamed on: Opener and Relay share a worker."""


def _relayed(request_id: str) -> Any:
    import asyncio

    return _RELAYED.setdefault(request_id, asyncio.Event())


class Opener:
    """Entry stage: streams its first sentence, then goes on working until the relay has streamed it on to
    the next process (as the default voice's preprocessing does, with its first sentence ready early)."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        await ctx.stream({"word": "first"})
        await _relayed(payload.request_id).wait()
        _RELAYED.pop(payload.request_id, None)
        return {}


class Relay:
    """Streams on what it is streamed (its receiver in another process)."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        async for chunk in ctx.chunks():
            await ctx.stream(chunk)
            _relayed(payload.request_id).set()
        return {}


class LateSpeaker(Speaker):
    """Speaker that works 0.3 s more once its stream ended: the request lasts well beyond the stages before it."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        import asyncio

        await super().process(payload, ctx)
        await asyncio.sleep(0.3)
        return None


def make_opener(name: str = "opener") -> Opener:
    return Opener()


def make_relay(name: str = "relay") -> Relay:
    return Relay()


def make_late_speaker(name: str = "speaker") -> LateSpeaker:
    return LateSpeaker()


def make_holding_speaker(name: str = "speaker") -> HoldingSpeaker:
    return HoldingSpeaker()


def make_talker(name: str = "talker") -> Talker:
    return Talker()


def make_speaker(name: str = "speaker") -> Speaker:
    return Speaker()


def make_nothing(name: str = "nothing") -> None:
    """A factory that forgets to return its executor."""
    return None


class NoOtelStage(EchoStage):
    """Fails the request when OpenTelemetry was imported in its worker (the daemon runs with no OTEL variables)."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        import sys

        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
        if loaded:
            raise RuntimeError(f"OpenTelemetry imported in worker {os.getpid()}: {', '.join(loaded[:5])}")
        return await super().process(payload, ctx)


def make_no_otel(name: str = "no-otel") -> NoOtelStage:
    return NoOtelStage(name, {})


def make_blob_source(name: str = "blob_source"):
    """Entry: a tensor and bytes of the request's `size` option (large payloads across processes)."""
    from tests.integration.dataplane_stages import BlobSource

    return BlobSource()


def make_blob_sink(name: str = "blob_sink"):
    """Terminal: one chunk at level 0.5 when the large payload arrived intact, -0.5 when not."""
    from tests.integration.dataplane_stages import BlobSink

    return BlobSink()
