"""Stages for the fault-injection tests: they check a large reference audio arrived intact and speak briefly."""

from __future__ import annotations

import hashlib

import numpy as np

from stagevisor.stages.base import StagePayload


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class Relay:
    """Entry stage: records the digest of the reference audio it received."""

    async def process(self, payload: StagePayload, ctx) -> dict:
        return {"digest": digest(payload.request["reference_audio"])}


class Speaker:
    """Terminal stage: fails unless both stages saw the client's exact bytes, then streams a little audio."""

    async def process(self, payload: StagePayload, ctx) -> None:
        async for _ in ctx.chunks():
            pass
        expected = payload.request["options"].get("digest", "")
        seen = {digest(payload.request["reference_audio"]), payload.data.get("digest")}
        if expected and seen != {expected}:
            raise RuntimeError(f"reference audio corrupted: expected {expected}, saw {sorted(map(str, seen))}")
        await ctx.stream({"audio": np.full(160, 0.25, np.float32), "sample_rate": 16000})
        return None


def make_relay(name: str = "relay") -> Relay:
    return Relay()


def make_speaker(name: str = "speaker") -> Speaker:
    return Speaker()
