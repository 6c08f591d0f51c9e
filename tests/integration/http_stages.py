"""Test executors for the HTTP and admission tests: a terminal stage that holds requests at a gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from stagevisor.stages.base import InvalidRequest, StageError, StagePayload

SAMPLE_RATE = 16000
CHUNKS = 4
CHUNK_SAMPLES = 800


def gate_audio() -> np.ndarray:
    """The audio one gated request streams, chunk after chunk (deterministic)."""
    return np.sin(np.arange(CHUNKS * CHUNK_SAMPLES, dtype=np.float32) / 7.0).astype(np.float32) * 0.5


class Gate:
    """Marks each request it sees (`<gate_dir>/seen-<id>`), waits for `<gate_dir>/open`, then streams audio.

    With the option `fail_mid_stream` it raises after its first chunk.

    The marker files are how a test counts the requests that reached a worker.
    """

    def __init__(self, name: str = "gate") -> None:
        self.name = name

    async def process(self, payload: StagePayload, ctx) -> None:
        gate = Path(payload.request["options"]["gate_dir"])
        (gate / f"seen-{payload.request_id}").touch()
        for _ in range(6000):  # at most 60 s: a test that forgets to open the gate still ends
            if (gate / "open").exists():
                break
            await asyncio.sleep(0.01)
        audio = gate_audio()
        for start in range(0, audio.size, CHUNK_SAMPLES):
            await ctx.stream({"audio": audio[start : start + CHUNK_SAMPLES], "sample_rate": SAMPLE_RATE})
            if payload.request["options"].get("fail_mid_stream"):
                raise RuntimeError("failed on purpose after the first chunk")
        return None


def make_gate(name: str = "gate") -> Gate:
    return Gate(name)


STAGE_ERROR_TEXT = "the voice 'ghost' is not loaded here;\nask for one of: joe"
"""What Refuser raises as a StageError: written for the client (its newline is for the sanitizer)."""
SECRET_TEXT = "connection to postgres://tts:hunter2@db failed"
"""What Refuser raises as any other exception: it must stay in the daemon log."""


CODED_TEXT = "option 'pace' is not one this stage takes"
"""What Refuser raises as a coded InvalidRequest (option `fail=coded`), with the code CODE."""
CODE = "X_Y"


class Refuser:
    """Fails every request before any audio: a StageError with option `fail=stage_error`, an InvalidRequest with
    the code CODE with `fail=coded`, else a RuntimeError.

    With `fail=after_audio` it streams one chunk first, so the RuntimeError ends a response already under way.
    """

    async def process(self, payload: StagePayload, ctx) -> None:
        fail = payload.request["options"].get("fail")
        if fail == "stage_error":
            raise StageError(STAGE_ERROR_TEXT)
        if fail == "coded":
            raise InvalidRequest(CODED_TEXT, code=CODE)
        if fail == "after_audio":
            await ctx.stream({"audio": gate_audio()[:CHUNK_SAMPLES], "sample_rate": SAMPLE_RATE})
        raise RuntimeError(SECRET_TEXT)


def make_refuser(name: str = "refuser") -> Refuser:
    return Refuser()


class Mute:
    """A terminal stage that ends every request without streaming any audio: a text it has nothing to say for."""

    async def process(self, payload: StagePayload, ctx) -> None:
        return None


def make_mute(name: str = "mute") -> Mute:
    return Mute()


class Parrot:
    """A stage that clones perfectly: it speaks its reference audio back (16 kHz), or a short tone without one.

    What a test hears proves which reference reached the worker.
    """

    async def process(self, payload: StagePayload, ctx) -> None:
        from stagevisor.stages.reference import decode_reference_wav

        reference = payload.request.get("reference_audio") or b""
        if reference:
            audio, rate = decode_reference_wav(bytes(reference))
        else:
            audio, rate = gate_audio(), SAMPLE_RATE
        for start in range(0, audio.size, CHUNK_SAMPLES):
            await ctx.stream({"audio": audio[start : start + CHUNK_SAMPLES], "sample_rate": rate})
        return None


def make_parrot() -> Parrot:
    return Parrot()
