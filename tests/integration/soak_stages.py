"""Stages for the soak tests: an entry streaming across processes to a terminal stage, each ending as the request's
options say (audio, an invalid request, a failure before or after the first chunk, a large handoff, the
terminal worker's death mid-request)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import numpy as np

from stagevisor.stages.base import InvalidRequest, StageContext, StagePayload

SAMPLE_RATE = 16_000
CHUNK_SAMPLES = 160
"""10 ms of audio a chunk."""
BIG_FLOATS = 128 * 1024
"""A 512 KiB array: above the shared-memory threshold, so it crosses the link as a pooled buffer."""


class Front:
    """Entry: streams `chunks` (default 4) latent chunks to the terminal stage, `interval` seconds apart, the
    first after `delay` seconds.

    Option `invalid` refuses the request (INVALID_ARGUMENT); `big` adds a 512 KiB array to every chunk.
    """

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        options = payload.request.get("options", {})
        if "invalid" in options:
            raise InvalidRequest("option 'invalid' is refused on purpose")
        interval = float(options.get("interval", "0"))
        big = np.ones(BIG_FLOATS, np.float32) if "big" in options else None
        count = int(options.get("chunks", "4"))
        await asyncio.sleep(float(options.get("delay", "0")))
        for index in range(count):
            await ctx.stream({"index": index, **({"big": big} if big is not None else {})})
            if interval:
                await asyncio.sleep(interval)
        return {"count": count}


class Voice:
    """Terminal: 10 ms of audio per chunk it receives (option `samples`: that many samples instead). Option
    `fail` = `before` raises before any audio, `after` after the first chunk of audio, `crash` ends the worker
    process after the first chunk (as a segfault in a native library would)."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        options = payload.request.get("options", {})
        fail = options.get("fail")
        samples = int(options.get("samples", CHUNK_SAMPLES))
        if fail == "before":
            raise RuntimeError("failed on purpose before any audio")
        async for chunk in ctx.chunks():
            level = 0.25 if "big" not in chunk else float(chunk["big"][:4].mean()) / 4
            await ctx.stream({"audio": np.full(samples, level, np.float32), "sample_rate": SAMPLE_RATE})
            if fail == "after":
                raise RuntimeError("failed on purpose after the first chunk")
            if fail == "crash":
                await asyncio.sleep(0.05)  # the chunk leaves first: the request fails mid-stream
                os._exit(3)
        return None


def make_front(name: str = "front") -> Front:
    return Front()


def make_voice(name: str = "voice") -> Voice:
    return Voice()
