"""The stagevisor.v1.Synthesis service: validates a request, runs it through the Gateway, streams PCM."""

from __future__ import annotations

import re
from typing import Any, AsyncIterator, Protocol

import grpc
import numpy as np

from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc
from stagevisor.supervisor.errors import RequestFailed

MAX_TEXT_CHARS = 5000
"""Longest text accepted, in characters; longer texts should be split by the client."""
MAX_REFERENCE_AUDIO_BYTES = 3 * 1024 * 1024
"""Largest reference audio accepted (fits gRPC's default 4 MiB message limit with room to spare)."""
MAX_AUDIO_CHUNK_BYTES = 1 << 20
"""Larger terminal chunks are split, so no AudioChunk nears a client's 4 MiB receive limit."""
MAX_OPTIONS = 32
MAX_OPTION_VALUE_CHARS = 256
OPTION_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""Control characters other than tab and line breaks: no text front end can speak them."""


class InvalidSynthesisRequest(ValueError):
    """The client's request is malformed; it gets INVALID_ARGUMENT with this message."""


def request_from_proto(message: spb.SynthesizeRequest) -> dict[str, Any]:
    """The `payload.request` dict the entry stage receives, after the service-level checks."""
    text = message.text
    if not text.strip():
        raise InvalidSynthesisRequest("text is empty; give the sentence to synthesize")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidSynthesisRequest(
            f"text has {len(text)} characters; the limit is {MAX_TEXT_CHARS}, split it into several requests")
    for field, value in (("text", text), ("reference_transcript", message.reference_transcript)):
        control = CONTROL_CHARACTER.search(value)
        if control:
            raise InvalidSynthesisRequest(
                f"{field} contains the control character {control.group()!r} at position {control.start()}; "
                "remove it")
    if len(message.reference_audio) > MAX_REFERENCE_AUDIO_BYTES:
        raise InvalidSynthesisRequest(
            f"reference audio is {len(message.reference_audio)} bytes; the limit is {MAX_REFERENCE_AUDIO_BYTES}")
    if len(message.options) > MAX_OPTIONS:
        raise InvalidSynthesisRequest(f"{len(message.options)} options given; at most {MAX_OPTIONS} are accepted")
    for key, value in message.options.items():
        if not OPTION_KEY.match(key):
            raise InvalidSynthesisRequest(
                f"option key {key!r} is malformed; use letters, digits, '_', '.', '-' (at most 64)")
        if len(value) > MAX_OPTION_VALUE_CHARS:
            raise InvalidSynthesisRequest(f"option {key!r} is longer than {MAX_OPTION_VALUE_CHARS} characters")
    return {
        "text": text,
        "voice": message.voice,
        "reference_audio": bytes(message.reference_audio),
        "reference_transcript": message.reference_transcript,
        "options": dict(message.options),
    }


def to_pcm16(audio: Any) -> bytes:
    """float audio in [-1, 1] -> 16-bit little-endian PCM, deterministically (clip, scale, truncate)."""
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def split_pcm(pcm: bytes, limit: int = MAX_AUDIO_CHUNK_BYTES) -> list[bytes]:
    """PCM cut into pieces of at most `limit` bytes, on sample boundaries."""
    step = max(2, limit - limit % 2)
    return [pcm[start:start + step] for start in range(0, len(pcm), step)] or [b""]


class OpenRequest(Protocol):
    """One admitted request: iterate it for the terminal stages' chunks; always close() it."""

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def close(self) -> None: ...


class PipelineEntry(Protocol):
    """What a public endpoint needs from the gateway: admit a request (raises RequestFailed)."""

    def open(self, payload: dict[str, Any]) -> OpenRequest: ...


class SynthesisServicer(sgrpc.SynthesisServicer):
    """Streams AudioChunk messages as the pipeline's terminal stages produce them."""

    def __init__(self, gateway: PipelineEntry) -> None:
        self.gateway = gateway

    async def Synthesize(self, request: spb.SynthesizeRequest, context: grpc.aio.ServicerContext):
        try:
            payload = request_from_proto(request)
        except InvalidSynthesisRequest as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        failure: RequestFailed | None = None
        try:
            handle = self.gateway.open(payload)
        except RequestFailed as error:
            await context.abort(getattr(grpc.StatusCode, error.status), error.message)
        try:
            sequence = 0
            async for chunk in handle:
                if not isinstance(chunk, dict) or "audio" not in chunk or "sample_rate" not in chunk:
                    failure = RequestFailed(
                        "INTERNAL", "a terminal stage streamed a chunk without 'audio' and 'sample_rate'")
                    break
                sample_rate = int(chunk["sample_rate"])
                for piece in split_pcm(to_pcm16(chunk["audio"])):
                    yield spb.AudioChunk(pcm=piece, sample_rate=sample_rate, sequence=sequence)
                    sequence += 1
        except RequestFailed as error:
            failure = error
        finally:
            # On client cancel or disconnect this runs with the generator closed: the
            # handle then sends CANCEL to every worker on the route.
            handle.close()
        if failure is not None:
            await context.abort(getattr(grpc.StatusCode, failure.status), failure.message)


def add_synthesis_to_server(gateway: PipelineEntry, server: grpc.aio.Server) -> None:
    sgrpc.add_SynthesisServicer_to_server(SynthesisServicer(gateway), server)
