"""The stagevisor.v1.Synthesis service: validates a request, runs it through the Gateway, streams PCM."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, Protocol, Sequence

import grpc
import numpy as np

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS, is_error_code, is_field_name
from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc
from stagevisor.supervisor.dataplane.admission import AdmissionRejected
from stagevisor.supervisor.dataplane.limits import (
    InvalidSynthesisRequest,
    LimitExceeded,
    RequestGuard,
    MAX_REFERENCE_TRANSCRIPT_CHARS,
    MAX_VOICE_CHARS,
    RequestLimits,
    check_request_fields,
    check_unicode,
    quote,
)
from stagevisor.supervisor.errors import RequestFailed, unexpected_failure
from stagevisor.supervisor.grpc_parsing import add_parsing_service
from stagevisor.supervisor.logs import promised

if TYPE_CHECKING:
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = DEFAULT_MAX_TEXT_CHARS
"""Longest text accepted unless the pipeline's executors declare less (the gateway's `max_text_chars`)."""
MAX_REFERENCE_AUDIO_SECONDS = 60
MAX_REFERENCE_SAMPLE_RATE = 48000
MAX_REFERENCE_AUDIO_BYTES = MAX_REFERENCE_AUDIO_SECONDS * MAX_REFERENCE_SAMPLE_RATE * 2 + 4096
"""Largest reference audio accepted: 60 s of 16-bit mono WAV at 48 kHz, plus room for its header."""
MAX_AUDIO_CHUNK_BYTES = 1 << 20
"""Larger terminal chunks are split, so no AudioChunk nears a client's 4 MiB receive limit."""
MAX_OPTIONS = 32
MAX_OPTION_VALUE_CHARS = 256
PROSE_OPTIONS = frozenset({"instructions"})
"""Options that carry prose (a voice description, a style): at most MAX_TEXT_CHARS, as HTTP's `instructions`."""
OPTION_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")  # \Z: `$` would also match before a final newline
MAX_REQUEST_BYTES = (
    MAX_REFERENCE_AUDIO_BYTES
    + 4 * (MAX_TEXT_CHARS + MAX_VOICE_CHARS + MAX_REFERENCE_TRANSCRIPT_CHARS)  # UTF-8: at most 4 bytes a character
    + MAX_OPTIONS * (64 + 4 * MAX_OPTION_VALUE_CHARS + 16)
    + len(PROSE_OPTIONS) * 4 * MAX_TEXT_CHARS
)
"""The largest SynthesizeRequest the declared input limits allow (protobuf framing aside)."""
PUBLIC_MAX_MESSAGE_BYTES = 2 * MAX_REQUEST_BYTES
"""The public gRPC server's receive limit. A request over the declared limits but under this one gets
INVALID_ARGUMENT naming the field (not retryable); only one over twice the limits meets gRPC's own
RESOURCE_EXHAUSTED "larger than max"."""
PUBLIC_HANDSHAKE_TIMEOUT_MS = 10_000
"""A connection must finish its TLS and HTTP/2 handshake this soon (gRPC's default, 120 s, let a client that
connects and sends nothing hold a descriptor for two minutes, as many times as it liked)."""
PUBLIC_MAX_CONNECTION_IDLE_MS = 300_000
"""A connection with no call for this long gets GOAWAY (a client's channel reconnects on its next call)."""
PUBLIC_SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", PUBLIC_MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", 4 * MAX_AUDIO_CHUNK_BYTES),
    ("grpc.server_handshake_timeout_ms", PUBLIC_HANDSHAKE_TIMEOUT_MS),
    ("grpc.max_connection_idle_ms", PUBLIC_MAX_CONNECTION_IDLE_MS),
)


def request_from_proto(message: spb.SynthesizeRequest, max_text_chars: int = MAX_TEXT_CHARS) -> dict[str, Any]:
    """The `payload.request` dict the entry stage receives, after the service-level checks."""
    return validate_request(
        message.text,
        voice=message.voice,
        reference_audio=bytes(message.reference_audio),
        reference_transcript=message.reference_transcript,
        options=dict(message.options),
        max_text_chars=max_text_chars,
    )


def validate_request(
    text: str,
    *,
    voice: str = "",
    reference_audio: bytes = b"",
    reference_transcript: str = "",
    options: dict[str, str] | None = None,
    max_text_chars: int = MAX_TEXT_CHARS,
) -> dict[str, Any]:
    """The service-level checks every transport applies (gRPC, HTTP); InvalidSynthesisRequest names the problem.

    `max_text_chars` is the gateway's: the smallest limit the pipeline's executors declare.
    """
    options = options or {}
    check_request_fields({"text": text, "voice": voice, "reference_transcript": reference_transcript}, max_text_chars)
    if len(reference_audio) > MAX_REFERENCE_AUDIO_BYTES:
        raise InvalidSynthesisRequest(
            f"reference audio is {len(reference_audio)} bytes; the limit is {MAX_REFERENCE_AUDIO_BYTES} "
            f"({MAX_REFERENCE_AUDIO_SECONDS} s of 16-bit mono audio at {MAX_REFERENCE_SAMPLE_RATE} Hz); "
            "send a shorter clip (retrying will not help)",
            "reference_audio",
        )
    if len(options) > MAX_OPTIONS:
        raise InvalidSynthesisRequest(f"{len(options)} options given; at most {MAX_OPTIONS} are accepted")
    for key, value in options.items():
        if not OPTION_KEY.match(key):
            raise InvalidSynthesisRequest(
                f"option key {quote(key)} is malformed; use letters, digits, '_', '.', '-' (at most 64)", key
            )
        try:
            check_unicode(f"option {quote(key)}", value)
        except InvalidSynthesisRequest as error:
            raise InvalidSynthesisRequest(str(error), key) from None
        limit = MAX_TEXT_CHARS if key in PROSE_OPTIONS else MAX_OPTION_VALUE_CHARS
        if len(value) > limit:
            raise InvalidSynthesisRequest(f"option {quote(key)} is longer than {limit} characters", key)
    return {
        "text": text,
        "voice": voice,
        "reference_audio": reference_audio,
        "reference_transcript": reference_transcript,
        "options": dict(options),
    }


def to_pcm16(audio: Any) -> bytes:
    """float audio in [-1, 1] -> 16-bit little-endian PCM, deterministically (clip, scale, truncate)."""
    samples = np.asarray(audio, dtype=np.float32).reshape(-1)
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def split_pcm(pcm: bytes, limit: int = MAX_AUDIO_CHUNK_BYTES) -> list[bytes]:
    """PCM cut into pieces of at most `limit` bytes, on sample boundaries."""
    step = max(2, limit - limit % 2)
    return [pcm[start : start + step] for start in range(0, len(pcm), step)] or [b""]


class OpenRequest(Protocol):
    """One admitted request: iterate it for the terminal stages' chunks; always close() it.

    Each chunk is playable: `{"audio": float samples, mono, "sample_rate": int}`, at one rate for the whole
    request. The gateway fails the request naming the stage when a chunk is not (`terminal_audio.audio_problem`).
    """

    request_id: str
    """Names the request in the daemon log and in a failed call's trailing metadata."""

    @property
    def timings(self) -> Sequence[tuple[str, float, float]]:
        """(name, start, end) of each finished branch's trace, as the terminal stages reported them."""

    def __aiter__(self) -> AsyncIterator[Any]: ...

    def close(self) -> None: ...


class PipelineEntry(Protocol):
    """What a public endpoint (gRPC Synthesis, the HTTP API) needs from the gateway.

    `submit` admits a request through admission control, waiting in its queue
    if need be; it raises AdmissionRejected before any worker sees the request,
    or RequestFailed.
    """

    async def submit(self, payload: dict[str, Any]) -> OpenRequest: ...

    @property
    def max_text_chars(self) -> int:
        """The longest text admitted (the smallest limit the pipeline's executors declare)."""

    limits: RequestLimits
    """Caps every public endpoint applies to a running request (RequestGuard)."""

    @property
    def metrics(self) -> DaemonMetrics | None:
        """The daemon's metrics, where requests are metered; None with metrics off."""

    @property
    def stage_groups(self) -> Mapping[str, str]:
        """Each stage's process group in this entry's topology: a request's timings name them."""


class SynthesisServicer(sgrpc.SynthesisServicer):
    """Streams AudioChunk messages as the pipeline's terminal stages produce them.

    When the gateway carries the daemon's metrics (`gateway.metrics`, absent
    with --no-metrics), each request is metered (latency, time to first audio,
    real-time factor, chunk gaps, outcome); its stage timings (`handle.timings`)
    go back to a client that asks and, when OTLP is configured, out as
    OpenTelemetry spans (the meter exports them as the request finishes).
    """

    def __init__(self, entry: Callable[[], PipelineEntry]) -> None:
        self.entry = entry
        """The daemon's current entry, looked up per request: a topology applied live brings a new gateway."""

    async def Synthesize(self, request: spb.SynthesizeRequest, context: grpc.aio.ServicerContext) -> None:
        gateway = self.entry()
        meter = gateway.metrics.start_request() if gateway.metrics is not None else None
        code = "UNKNOWN"  # an unexpected error, unless set below
        try:
            try:
                payload = request_from_proto(request, gateway.max_text_chars)
            except InvalidSynthesisRequest as error:
                code = "INVALID_ARGUMENT"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            failure: RequestFailed | None = None
            if request.timings or (meter is not None and meter.exports_spans):
                payload["timings"] = True  # terminal stages then report the request's spans
            try:
                handle = await gateway.submit(payload)
                if meter is not None:
                    meter.attach(handle)
            except AdmissionRejected as error:
                code = error.status
                if error.retry_after is not None:  # gRPC's standard retry pushback; retry policies wait this long
                    context.set_trailing_metadata((("grpc-retry-pushback-ms", str(error.retry_after * 1000)),))
                await context.abort(getattr(grpc.StatusCode, error.status), error.message)
            except RequestFailed as error:
                code = error.status
                await context.abort(
                    getattr(grpc.StatusCode, error.status),
                    error.public_message(),
                    trailing_metadata=failure_metadata(error),
                )
            started = meter.started if meter is not None else time.monotonic()
            first_audio: float | None = None
            sequence = 0
            sample_rate = 0
            # The guard bounds the request: its audio, its wall time, and how long one write may
            # wait for a client that reads nothing (writes are awaited, not yielded, to time them).
            guard = RequestGuard(gateway.limits)
            try:
                async for chunk in guard.chunks(handle):  # playable audio: the gateway checked it (audio_problem)
                    sample_rate = int(chunk["sample_rate"])
                    pcm = to_pcm16(chunk["audio"])
                    if first_audio is None:
                        first_audio = time.monotonic() - started
                    if meter is not None:
                        meter.audio(len(pcm) // 2, sample_rate)
                    for piece in split_pcm(pcm):
                        await guard.send(
                            context.write(spb.AudioChunk(pcm=piece, sample_rate=sample_rate, sequence=sequence))
                        )
                        sequence += 1
            except RequestFailed as error:  # LimitExceeded included
                failure = error
            except Exception as error:  # noqa: BLE001 - the detail is for the operator's log, never for the client
                if context.cancelled():
                    # The client went away while a write was in flight: gRPC fails that write
                    # (ExecuteBatchError) instead of cancelling the handler. Nothing failed here.
                    code = _client_ended(context)
                    return
                log.exception("request %s failed in the daemon", handle.request_id, extra=promised(handle.request_id))
                failure = unexpected_failure(error, handle.request_id)
            finally:
                # On client cancel or disconnect this runs as the handler is cancelled: the
                # handle then sends CANCEL to every worker on the route.
                handle.close()
            if failure is not None:
                code = failure.status
                if isinstance(failure, LimitExceeded) and failure.stalled_write is not None:
                    # The pipeline has let go of the request; gRPC takes a status only once the
                    # pending message left, i.e. when the client reads again or disconnects, which a
                    # client that stopped reading may never do: the request ends for the metrics now.
                    if meter is not None:
                        meter.finish(code)
                    await asyncio.gather(failure.stalled_write, return_exceptions=True)
                await context.abort(
                    getattr(grpc.StatusCode, failure.status),
                    failure.public_message(),
                    trailing_metadata=failure_metadata(failure),
                )
            code = "OK"
            if request.timings:
                if meter is not None:
                    timings = meter.timings()  # the same RequestTimings as its OTLP spans, if exported
                else:
                    from stagevisor.supervisor.metrics.timings import request_timings

                    timings = request_timings(
                        handle.timings, started, time.monotonic(), first_audio, gateway.stage_groups
                    )
                try:
                    await guard.send(
                        context.write(spb.AudioChunk(sample_rate=sample_rate, sequence=sequence, timings=timings))
                    )
                except RequestFailed as error:  # the client stopped reading before the timings
                    code = error.status
                    await context.abort(getattr(grpc.StatusCode, error.status), error.public_message())
        except asyncio.CancelledError:
            # The client went away mid-stream, or its own deadline passed: gRPC cancels the handler
            # either way, and the client then got DEADLINE_EXCEEDED, not CANCELLED.
            code = _client_ended(context)
            raise
        except grpc.aio.AbortError:
            raise  # a status set above
        except Exception as error:
            # Unhandled, grpc.aio would send the client "Unexpected <class>: <text>", text that may name
            # paths or hosts: the client gets the class and an id, the log the rest.
            unexpected = unexpected_failure(error)
            log.exception(
                "request %s failed in the daemon", unexpected.request_id, extra=promised(unexpected.request_id)
            )
            code = unexpected.status
            await context.abort(
                grpc.StatusCode.INTERNAL, unexpected.public_message(), trailing_metadata=failure_metadata(unexpected)
            )
        finally:
            if meter is not None:
                meter.finish(code)


def _client_ended(context: grpc.aio.ServicerContext) -> str:
    """The code a call the client ended got: DEADLINE_EXCEEDED once its deadline passed, else CANCELLED."""
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"


ERROR_CODE_KEY = "stagevisor-error-code"
"""The trailing metadata key of a failing stage's own code (StageError's `code`), beside the status."""
ERROR_FIELD_KEY = "stagevisor-error-field"
"""The trailing metadata key of the request field a failing stage's refusal is about (StageError's `field`)."""


def failure_metadata(failure: Any) -> tuple[tuple[str, str], ...]:
    """Trailing metadata of a failed call: the request id (for the operator's log), the failing stage, the
    stage's own code and the request field it names, and gRPC's retry pushback where the failure says when to
    retry (as admission's refusals while starting do). The daemon's own codes (audio_limit_exceeded) are the HTTP
    API's and stay out of it."""
    code = failure.code if is_error_code(failure.code) else ""
    field = failure.field if is_field_name(failure.field) else ""
    pushback = str(failure.retry_after * 1000) if failure.retry_after is not None else ""
    pairs = [
        ("stagevisor-request-id", failure.request_id),
        ("stagevisor-stage", failure.stage),
        (ERROR_CODE_KEY, code),
        (ERROR_FIELD_KEY, field),
        ("grpc-retry-pushback-ms", pushback),
    ]
    return tuple((key, value) for key, value in pairs if value)


def add_synthesis_to_server(entry: Callable[[], PipelineEntry], server: grpc.aio.Server) -> None:
    """Serve Synthesis on `server` through the entry `entry()` returns at each request; a request that does not
    parse is INVALID_ARGUMENT saying so (grpc_parsing)."""
    add_parsing_service(
        sgrpc.add_SynthesisServicer_to_server, SynthesisServicer(entry), server, "proto/stagevisor/v1/synthesis.proto"
    )
