"""Executors for the `stagevisor check --verify-edges` tests: one edge hands over a process-local object."""

from __future__ import annotations

import numpy as np

from stagevisor.stages.base import StageError

_PREPARED: dict[str, float] = {}
"""Filled by the frontend, read by the engine: only works while both share a process."""


class Frontend:
    async def process(self, payload, ctx):
        _PREPARED[payload.request_id] = len(payload.request["text"]) / 100.0
        return {"ready": True}


class Engine:
    async def process(self, payload, ctx):
        level = _PREPARED.pop(payload.request_id, None)
        if level is None:
            raise StageError("no prepared state for this request in this process")
        for _ in range(3):
            await ctx.stream({"level": level})
        return {}


class Vocoder:
    async def process(self, payload, ctx):
        async for chunk in ctx.chunks():
            await ctx.stream({"audio": np.full(64, chunk["level"], dtype=np.float32), "sample_rate": 16000})
        return None


def frontend():
    return Frontend()


def engine():
    return Engine()


def vocoder():
    return Vocoder()
