"""Running one speech request: admit it, wait for its first chunk, then encode its audio as the pipeline makes it.

A request is admitted through `Gateway.submit` (admission control shared
with gRPC), and a response's status is chosen only once the pipeline has
produced its first chunk or failed: an executor's INVALID_ARGUMENT is a 400,
not a broken 200 stream. `open_speech` does that much and returns a
`SpeechStream`, which POST /v1/audio/speech streams (audio or SSE), the
batch endpoint collects and the WebSocket sends. Audio at another rate than
asked for is resampled (soxr) before it is encoded. A client that goes away
closes the stream's handle, which cancels the request in every worker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping, Protocol

import numpy as np
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from stagevisor.supervisor.dataplane.admission import Admission, AdmissionRejected
from stagevisor.supervisor.dataplane.limits import LimitExceeded, RequestGuard
from stagevisor.supervisor.dataplane.synthesis import OpenRequest, PipelineEntry, to_pcm16
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.http import backlog
from stagevisor.supervisor.http.audio import MEDIA_TYPES, Encoder, Resampler, make_encoder
from stagevisor.supervisor.http.errors import STATUS_FOR, ApiError
from stagevisor.supervisor.http.request import SpeechRequest, to_payload
from stagevisor.supervisor.metrics.registry import RequestMeter

log = logging.getLogger("stagevisor.http")


class SpeechGateway(PipelineEntry, Protocol):
    """What the HTTP API uses of the data plane's Gateway: the public endpoints' entry, its admission and meters."""

    @property
    def admission(self) -> Admission: ...


FALLBACK_SAMPLE_RATE = 24000
"""Sample rate of the (empty) stream of a request that produced no audio and whose voices declare none."""


class ClientGone(Exception):
    """The client disconnected before the response started."""


class StreamAborted(Exception):
    """The request failed after the response started; the connection is closed mid-body."""


async def _wait_disconnect(receive: Callable[[], Awaitable[MutableMapping[str, Any]]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request | None, work: Awaitable[Any]) -> Any:
    """Await `work`, or cancel it and raise ClientGone as soon as the client disconnects (None: just await)."""
    if request is None:
        return await work
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        watch.cancel()
        raise
    watch.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


def status_of(error: ApiError) -> str:
    """The grpc status name an HTTP error stands for (the `code` label of request metrics)."""
    for name, (http, _) in STATUS_FOR.items():
        if http == error.status:
            return name
    return "INVALID_ARGUMENT" if error.status < 500 else "INTERNAL"


def finish(meter: RequestMeter | None, code: str) -> None:
    if meter is not None:
        meter.finish(code)


class SpeechStream:
    """An admitted request whose first chunk has come (or whose audio is empty): its encoded audio, in pieces.

    Iterate `pieces()` once; it raises RequestFailed when the request fails
    mid-stream. Always `close()` it (idempotent): that releases the
    request's admission slot and cancels it in the workers if still running.
    """

    def __init__(
        self,
        handle: OpenRequest,
        chunks: AsyncIterator[Any],
        first: Any,
        speech: SpeechRequest,
        sample_rate_hint: int,
        meter: RequestMeter | None,
        guard: RequestGuard,
    ) -> None:
        self.handle = handle
        self.guard = guard
        """The request's limits, which also bound each write to the client."""
        self.request_id: str = handle.request_id
        self._chunks = chunks
        self._first = first
        self.model_rate = int(first["sample_rate"]) if first is not None else sample_rate_hint
        rate = speech.sample_rate or self.model_rate
        self.encoder: Encoder = make_encoder(speech.response_format, rate)
        self._resampler = Resampler(self.model_rate, rate) if rate != self.model_rate else None
        self.samples = 0
        """Samples of audio sent so far, at the encoder's input rate."""
        self._meter = meter
        self._closed = False
        self.code = "CANCELLED"
        """The outcome counted when the stream closes: CANCELLED unless it ran to its end or failed."""

    @property
    def sample_rate(self) -> int:
        """The rate of the audio the client receives."""
        return self.encoder.output_rate

    async def pieces(self) -> AsyncIterator[bytes]:
        pending = self._first
        try:
            while pending is not None:
                if self._meter is not None:
                    self._meter.audio(np.asarray(pending["audio"]).size, self.model_rate)
                data = await self._encode(pending["audio"])
                if data:
                    yield data
                pending = await next_chunk(self._chunks)
            tail = await self._encode(self._resampler.flush(), resample=False) if self._resampler is not None else b""
            tail += await asyncio.to_thread(self.encoder.finish) if self.encoder.threaded else self.encoder.finish()
            if tail:
                yield tail
            self.code = "OK"
        except RequestFailed as error:
            self.code = error.status
            raise
        except Exception:
            self.code = "UNKNOWN"  # an unexpected error, as the gRPC servicer counts it
            raise

    async def _encode(self, audio: Any, *, resample: bool = True) -> bytes:
        samples = self._resampler.push(audio) if resample and self._resampler is not None else audio
        pcm = to_pcm16(samples)
        self.samples += len(pcm) // 2
        # A codec takes milliseconds per chunk: off the event loop, which serves every request.
        return await asyncio.to_thread(self.encoder.encode, pcm) if self.encoder.threaded else self.encoder.encode(pcm)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Also on a disconnect: closing the handle sends CANCEL to every worker on the route.
        self.handle.close()
        self.encoder.close()
        finish(self._meter, self.code)


async def open_speech(
    gateway: SpeechGateway,
    speech: SpeechRequest,
    sample_rate_hint: int,
    meter: RequestMeter | None = None,
    request: Request | None = None,
) -> SpeechStream:
    """Admit the request and wait for its first chunk; ApiError (429, 400, ...) when it cannot start.

    `request`, when given, is watched: a client that disconnects meanwhile
    cancels the request (ClientGone). `meter` is finished here when the
    request fails before its stream exists, else when the stream closes.
    """
    try:
        payload = to_payload(speech, gateway.max_text_chars)
    except ApiError as error:
        finish(meter, status_of(error))
        raise
    if meter is not None and meter.exports_spans:
        payload["timings"] = True  # terminal stages report the request's spans, exported over OTLP
    try:
        try:
            handle = await unless_disconnected(request, gateway.submit(payload))
            if meter is not None:
                meter.attach(handle)
        except AdmissionRejected as error:
            finish(meter, error.status)
            # No retry time: nothing a client waits for ends it (a FAILED group); OpenAI's SDKs retry a 503 unless told.
            retry = (
                {"X-Should-Retry": "false"} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
            )
            raise ApiError.from_status(error.status, error.message, code=error.reason.lower(), headers=retry) from None
        except RequestFailed as error:
            finish(meter, error.status)
            raise ApiError.from_failure(error) from None
        # The same caps as gRPC: the audio duration and the server-side deadline (LimitExceeded is a RequestFailed).
        guard = RequestGuard(gateway.limits)
        chunks = guard.chunks(handle).__aiter__()
        try:
            first = await unless_disconnected(request, next_chunk(chunks))
            return SpeechStream(handle, chunks, first, speech, sample_rate_hint, meter, guard)
        except RequestFailed as error:
            handle.close()
            finish(meter, error.status)
            api_error = ApiError.from_failure(error)
            if api_error.param is None:  # the stage named no field: an option its message names is the one at fault
                api_error.param = next((key for key in speech.options if repr(key) in error.message), None)
            raise api_error from None
        except BaseException:
            handle.close()
            raise
    except (ClientGone, asyncio.CancelledError):
        finish(meter, "CANCELLED")
        raise
    except ApiError:
        raise
    except BaseException:
        finish(meter, "UNKNOWN")
        raise


async def next_chunk(chunks: AsyncIterator[Any]) -> Any:
    """The next chunk, or None at the end of the stream; RequestFailed when the request failed.

    A chunk is playable audio at the request's one rate: the gateway fails the request otherwise (`audio_problem`).
    """
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


async def synthesize(
    request: Request,
    gateway: SpeechGateway,
    speech: SpeechRequest,
    sample_rate_hint: int,
    meter: RequestMeter | None = None,
) -> Response:
    """POST /v1/audio/speech: open the request, then stream its encoded audio (or SSE events)."""
    stream = await open_speech(gateway, speech, sample_rate_hint, meter, request)
    headers = {
        "Cache-Control": "no-store",
        "X-Accel-Buffering": "no",
        "X-Request-Id": stream.request_id,
        "X-Sample-Rate": str(stream.sample_rate),
    }
    if speech.stream_format == "sse":
        return GuardedStreamingResponse(stream, _sse(stream, speech), media_type="text/event-stream", headers=headers)
    return GuardedStreamingResponse(
        stream, _audio(stream), media_type=MEDIA_TYPES[speech.response_format], headers=headers
    )


class GuardedStreamingResponse(StreamingResponse):
    """A streamed body whose writes the request's guard bounds, as the gRPC servicer's are: a client that reads
    nothing for --stream-idle-timeout (or past --request-timeout) loses its request (DEADLINE_EXCEEDED), which
    ends in the workers and frees its admission slot at once; its connection is reset (backlog.reset_stalled).
    A client that reads, however slowly, is not idle: a waiting write watches its connection's backlog."""

    def __init__(self, stream: SpeechStream, content: AsyncIterator[bytes], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._stream = stream

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stream = self._stream
        guard = stream.guard
        unsent = backlog.current()  # a write waiting on a client that still reads is not idle

        async def guarded(message: MutableMapping[str, Any]) -> None:
            if message["type"] != "http.response.body":  # the headers: the body's writes are the ones bounded
                await send(message)
                return
            try:
                await guard.send(send(message), unsent)
            except LimitExceeded as error:
                log.warning("request %s ended: %s", stream.request_id, error.message)
                stream.code = error.status
                stream.close()
                # The write cannot be taken back, and it would leave only when the client reads again or goes
                # away: the connection is reset, which ends the write.
                backlog.reset_stalled()
                await asyncio.gather(*filter(None, [error.stalled_write]), return_exceptions=True)
                raise StreamAborted(error.message) from None

        try:
            await super().__call__(scope, receive, guarded)
        finally:
            # Not left to the body's own `finally`: a client that leaves during a write (it stopped reading, then
            # went away) has Starlette cancel that write, and the body stays suspended between two pieces until
            # the garbage collector finalizes it; a response whose start fails never runs its body at all. Until
            # then the request would keep its admission slot and its workers' state.
            stream.close()


async def _audio(stream: SpeechStream) -> AsyncIterator[bytes]:
    try:
        async for piece in stream.pieces():
            yield piece
    except RequestFailed as error:
        log.warning("request %s failed mid-stream: %s %s", stream.request_id, error.status, error.message)
        raise StreamAborted(error.message) from None
    finally:
        stream.close()


def sse_usage(characters: int, seconds: float) -> dict[str, int | float]:
    """`speech.audio.done`'s usage: OpenAI's three token counts, which its clients require (typed ones fail
    without them), and what stagevisor measures. There is no tokenizer common to the models served, so a token
    is an input character, the unit the request limits count (OpenAI bills its tts models by the character too);
    the audio is counted in seconds, to the millisecond (a duration, not 1.5500226757369615 s of 11025 Hz audio),
    and output_tokens is 0."""
    return {
        "input_tokens": characters,
        "output_tokens": 0,
        "total_tokens": characters,
        "input_characters": characters,
        "output_audio_seconds": round(seconds, 3),
    }


async def _sse(stream: SpeechStream, speech: SpeechRequest) -> AsyncIterator[bytes]:
    try:
        async for piece in stream.pieces():
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode("ascii")})
        seconds = stream.samples / stream.encoder.sample_rate
        yield sse_event({"type": "speech.audio.done", "usage": sse_usage(len(speech.input), seconds)})
    except RequestFailed as error:
        log.warning("request %s failed mid-stream: %s %s", stream.request_id, error.status, error.message)
        yield sse_event({"type": "error", **ApiError.from_failure(error).body()})
    finally:
        stream.close()


def sse_event(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"
