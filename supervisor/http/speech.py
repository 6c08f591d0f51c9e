"""`POST /v1/audio/speech`: OpenAI's request fields in, audio streamed out as the pipeline makes it.

The request is checked here and by the same service-level checks as the gRPC
Synthesis service (synthesis.validate_request), admitted through
`Gateway.submit` (admission control shared with gRPC), and the response
status is chosen only once the pipeline has produced its first chunk or
failed: an executor's INVALID_ARGUMENT is a 400, not a broken 200 stream.
A client that goes away (while queued, while waiting for the first chunk or
mid-stream) closes the request handle, which cancels it in every worker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from stagevisor.supervisor.dataplane.admission import AdmissionRejected
from stagevisor.supervisor.dataplane.limits import RequestGuard, RequestLimits
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.dataplane.synthesis import (
    CONTROL_CHARACTER,
    MAX_TEXT_CHARS,
    OPTION_KEY,
    InvalidSynthesisRequest,
    to_pcm16,
    validate_request,
)
from stagevisor.supervisor.http.audio import FORMATS, MEDIA_TYPES, make_encoder
from stagevisor.supervisor.http.errors import STATUS_FOR, ApiError

log = logging.getLogger("stagevisor.http")

MAX_BODY_BYTES = 256 * 1024
"""Largest request body: the longest input plus every option fits in a fraction of it."""
SPEED_RANGE = (0.25, 4.0)
OPENAI_FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream_format")
STREAM_FORMATS = ("audio", "sse")
FALLBACK_SAMPLE_RATE = 24000
"""Sample rate of the (empty) stream of a request that produced no audio and whose voices declare none."""


@dataclass
class SpeechRequest:
    """A validated `POST /v1/audio/speech` body."""

    model: str
    input: str
    voice: str = ""
    instructions: str = ""
    response_format: str = "mp3"
    speed: float | None = None
    stream_format: str = "audio"
    options: dict[str, str] = field(default_factory=dict)
    """Executor options: the extra fields (e.g. noise_scale) as strings, plus length_scale from speed."""


async def read_json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; ApiError 415 (content type), 413 (too large) or 400 (not a JSON object)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            415, f"Content-Type must be application/json, got {media_type or 'none'!r}", code="unsupported_media_type"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(
            413, f"request body is {declared} bytes; the limit is {MAX_BODY_BYTES}", code="request_too_large"
        )
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
    try:
        data = json.loads(bytes(body), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError(400, f"the body is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _string(data: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = data.get(name, default)
    if value is None:
        raise ApiError(400, f"'{name}' is required", param=name, code="missing_required_parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string, got {_json_type(value)}", param=name, code="invalid_type")
    return value


def _json_type(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def parse_speech_request(
    data: Mapping[str, Any], *, models: tuple[str, ...], voices: list[dict[str, Any]]
) -> SpeechRequest:
    """Validate OpenAI's fields and the extra executor options; ApiError (400/404) names the field."""
    model = _string(data, "model")
    if model not in models:
        raise ApiError(
            404,
            f"model {model!r} is not served here; this daemon serves {' or '.join(map(repr, models))}",
            param="model",
            code="model_not_found",
        )
    text = _string(data, "input")
    voice_value = data.get("voice", "")
    if isinstance(voice_value, dict) and set(voice_value) == {"id"}:
        voice_value = voice_value["id"]  # OpenAI's custom-voice form {"id": "..."}
    if not isinstance(voice_value, str):
        raise ApiError(
            400,
            f"'voice' must be a string or {{\"id\": string}}, got {_json_type(voice_value)}",
            param="voice",
            code="invalid_type",
        )
    voice = voice_value.strip()
    if voices and voice not in _voice_names(voices):
        known = ", ".join(repr(v["id"]) for v in voices)
        raise ApiError(
            400,
            f"voice {voice!r} is not available; voices: {known} (GET /v1/audio/voices)",
            param="voice",
            code="voice_not_found",
        )
    instructions = _string(data, "instructions", "")
    if len(instructions) > MAX_TEXT_CHARS or CONTROL_CHARACTER.search(instructions):
        raise ApiError(
            400,
            f"'instructions' must be at most {MAX_TEXT_CHARS} characters without control characters",
            param="instructions",
            code="invalid_value",
        )
    response_format = _string(data, "response_format", "mp3")
    if response_format not in FORMATS:
        raise ApiError(
            400,
            f"response_format {response_format!r} is not supported; use one of {', '.join(FORMATS)}",
            param="response_format",
            code="invalid_value",
        )
    stream_format = _string(data, "stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise ApiError(
            400,
            f"stream_format {stream_format!r} is not supported; use 'audio' or 'sse'",
            param="stream_format",
            code="invalid_value",
        )
    speed = data.get("speed")
    if speed is not None:
        if isinstance(speed, bool) or not isinstance(speed, (int, float)):
            raise ApiError(
                400, f"'speed' must be a number, got {_json_type(speed)}", param="speed", code="invalid_type"
            )
        low, high = SPEED_RANGE
        if not (low <= speed <= high):
            raise ApiError(
                400,
                f"speed {speed!r} is out of range; use {low:g} to {high:g} (1.0 is normal speed)",
                param="speed",
                code="invalid_value",
            )
    options = _extra_options(data)
    if speed is not None and float(speed) != 1.0:
        if "length_scale" in options:
            raise ApiError(400, "give either 'speed' or 'length_scale', not both", param="speed", code="invalid_value")
        options["length_scale"] = repr(1.0 / float(speed))
    return SpeechRequest(
        model=model,
        input=text,
        voice=voice,
        instructions=instructions,
        response_format=response_format,
        speed=None if speed is None else float(speed),
        stream_format=stream_format,
        options=options,
    )


def _voice_names(voices: list[dict[str, Any]]) -> set[str]:
    names = {""}
    for voice in voices:
        names.add(str(voice.get("id", "")))
        names.update(str(alias) for alias in voice.get("aliases", ()))
    return names


def _extra_options(data: Mapping[str, Any]) -> dict[str, str]:
    """Fields beyond OpenAI's are executor options (noise_scale, ...): scalar values, sent as strings."""
    options: dict[str, str] = {}
    for key, value in data.items():
        if key in OPENAI_FIELDS:
            continue
        if not OPTION_KEY.match(key):
            raise ApiError(
                400,
                f"unknown field {key!r}; extra fields are executor options named with letters, digits, '_', '.', '-'",
                param=key,
                code="unknown_parameter",
            )
        if isinstance(value, bool):
            options[key] = "true" if value else "false"
        elif isinstance(value, int):
            options[key] = str(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ApiError(400, f"option {key!r} must be finite", param=key, code="invalid_value")
            options[key] = repr(value)
        elif isinstance(value, str):
            options[key] = value
        else:
            raise ApiError(
                400,
                f"option {key!r} must be a string, number or boolean, got {_json_type(value)}",
                param=key,
                code="invalid_type",
            )
    return options


def to_payload(speech: SpeechRequest, max_text_chars: int = MAX_TEXT_CHARS) -> dict[str, Any]:
    """The pipeline request: the gRPC service's checks, plus `instructions` for executors that use it."""
    try:
        payload = validate_request(
            speech.input, voice=speech.voice, options=speech.options, max_text_chars=max_text_chars
        )
    except InvalidSynthesisRequest as error:
        param = "input" if str(error).startswith("text") else None
        raise ApiError(
            400, str(error).replace("text ", "input ", 1) if param else str(error), param=param, code="invalid_value"
        ) from None
    if speech.instructions:
        payload["instructions"] = speech.instructions
    return payload


class ClientGone(Exception):
    """The client disconnected before the response started."""


async def _wait_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Await `work`, or cancel it and raise ClientGone as soon as the client disconnects."""
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


async def synthesize(
    request: Request, gateway: Any, speech: SpeechRequest, sample_rate_hint: int, meter: Any = None
) -> Response:
    """Admit, wait for the first chunk, then stream the encoded audio (or SSE events).

    `meter` (a RequestMeter, None with metrics off) is finished here when the
    request fails before its response starts, else when the stream ends.
    """
    try:
        payload = to_payload(speech, getattr(gateway, "max_text_chars", MAX_TEXT_CHARS))
    except ApiError as error:
        _finish(meter, status_of(error))
        raise
    if meter is not None and meter.exports_spans:
        payload["timings"] = True  # terminal stages report the request's spans, exported over OTLP
    try:
        try:
            handle = await unless_disconnected(request, gateway.submit(payload))
            if meter is not None:
                meter.attach(handle)
        except AdmissionRejected as error:
            _finish(meter, error.status)
            raise ApiError.from_status(
                error.status, error.message, code=error.reason.lower(), headers={"Retry-After": str(error.retry_after)}
            ) from None
        except RequestFailed as error:
            _finish(meter, error.status)
            raise ApiError.from_status(error.status, error.public_message()) from None
        # The same caps as gRPC: the audio duration and the server-side deadline (LimitExceeded is a RequestFailed).
        chunks = RequestGuard(getattr(gateway, "limits", None) or RequestLimits()).chunks(handle).__aiter__()
        try:
            first = await unless_disconnected(request, _next(chunks))
        except RequestFailed as error:
            handle.close()
            _finish(meter, error.status)
            api_error = ApiError.from_status(error.status, error.public_message())
            # An executor that rejects an option names it: point `param` at that field.
            api_error.param = next((key for key in speech.options if repr(key) in error.message), None)
            raise api_error from None
        except BaseException:
            handle.close()
            raise
    except (ClientGone, asyncio.CancelledError):
        _finish(meter, "CANCELLED")
        raise
    except ApiError:
        raise
    except BaseException:
        _finish(meter, "UNKNOWN")
        raise
    stream = _stream(handle, chunks, first, speech, sample_rate_hint, meter)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Request-Id": handle.request_id}
    if speech.stream_format == "sse":
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    if first is not None:
        headers["X-Sample-Rate"] = str(int(first["sample_rate"]))
    return StreamingResponse(stream, media_type=MEDIA_TYPES[speech.response_format], headers=headers)


async def _next(chunks: AsyncIterator[Any]) -> Any:
    """The next chunk, or None at the end of the stream; RequestFailed when the request failed."""
    try:
        chunk = await chunks.__anext__()
    except StopAsyncIteration:
        return None
    _check_chunk(chunk)
    return chunk


def _check_chunk(chunk: Any) -> None:
    if not isinstance(chunk, dict) or "audio" not in chunk or "sample_rate" not in chunk:
        raise RequestFailed("INTERNAL", "a terminal stage streamed a chunk without 'audio' and 'sample_rate'")


class StreamAborted(Exception):
    """The request failed after the response started; the connection is closed mid-body."""


def _finish(meter: Any, code: str) -> None:
    if meter is not None:
        meter.finish(code)


async def _stream(
    handle: Any, chunks: AsyncIterator[Any], first: Any, speech: SpeechRequest, sample_rate_hint: int, meter: Any = None
) -> AsyncIterator[bytes]:
    sse = speech.stream_format == "sse"
    encoder = None
    samples = 0
    code = "CANCELLED"  # the client went away mid-stream, unless set below
    try:
        pending = first
        while pending is not None:
            rate = int(pending["sample_rate"])
            if encoder is None:
                encoder = make_encoder(speech.response_format, rate)
            elif rate != encoder.sample_rate:
                raise RequestFailed("INTERNAL", f"the sample rate changed mid-stream ({encoder.sample_rate} -> {rate})")
            pcm = to_pcm16(pending["audio"])
            samples += len(pcm) // 2
            if meter is not None:
                meter.audio(len(pcm) // 2, rate)
            # A codec takes milliseconds per chunk: off the event loop, which serves every request.
            data = await asyncio.to_thread(encoder.encode, pcm) if encoder.threaded else encoder.encode(pcm)
            if data:
                yield _sse_delta(data) if sse else data
            pending = await _next(chunks)
        if encoder is None:
            encoder = make_encoder(speech.response_format, sample_rate_hint)
        tail = await asyncio.to_thread(encoder.finish) if encoder.threaded else encoder.finish()
        if tail:
            yield _sse_delta(tail) if sse else tail
        if sse:
            seconds = samples / encoder.sample_rate
            yield _sse_event(
                {
                    "type": "speech.audio.done",
                    "usage": {"input_characters": len(speech.input), "output_audio_seconds": seconds},
                }
            )
        code = "OK"
    except RequestFailed as error:
        code = error.status
        log.warning("request %s failed mid-stream: %s %s", handle.request_id, error.status, error.message)
        if sse:
            yield _sse_event({"type": "error", **ApiError.from_status(error.status, error.public_message()).body()})
        else:
            raise StreamAborted(error.message) from None
    except Exception:
        code = "UNKNOWN"  # an unexpected error, as the gRPC servicer counts it
        raise
    finally:
        # Also on a disconnect: the response task is cancelled here, and closing
        # the handle sends CANCEL to every worker on the route.
        handle.close()
        if encoder is not None:
            encoder.close()
        _finish(meter, code)


def _sse_event(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def _sse_delta(audio: bytes) -> bytes:
    return _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode("ascii")})
