"""Executors for the `stagevisor check --verify-edges` tests: edges that hand over process-local state."""

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


class ReusingEngine:
    """Streams every chunk in one reused buffer: in one process the vocoder reads it after it was overwritten."""

    def __init__(self) -> None:
        self._frame = np.zeros(4, dtype=np.int32)

    async def process(self, payload, ctx):
        for step in range(3):
            self._frame[:] = step
            await ctx.stream({"level": 0.25, "frame": self._frame})
        return {}


class TokenFrontend:
    async def process(self, payload, ctx):
        return {"tokens": [1, 2, 3]}


class TokenEngine(ReusingEngine):
    async def process(self, payload, ctx):
        assert payload.data["tokens"] == [1, 2, 3]
        return await super().process(payload, ctx)


def reusing_engine():
    return TokenEngine()


def token_frontend():
    return TokenFrontend()
