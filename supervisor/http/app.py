"""The ASGI application: routes of the OpenAI-compatible API, health, readiness, topology and the playground.

`create_app(daemon, extra_routes=...)` is the one place routes are added:
other parts of the daemon (metrics) pass theirs in `extra_routes`. The app
talks to the daemon only through `SpeechDaemon`, so tests can drive it with
a fake and the daemon's internals stay on their side.
"""

from __future__ import annotations

import asyncio
import contextvars
import http
import json
import logging
import time
from importlib import resources
from typing import Any, Mapping, Protocol, Sequence
from urllib.parse import parse_qsl, unquote_plus

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from stagevisor.supervisor.http.batch import (
    MAX_BATCH_BODY_BYTES,
    HeldAudio,
    batch_items,
    batch_response,
    run_item,
)
from stagevisor.supervisor import package_version
from stagevisor.supervisor.errors import unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.names import (
    SpeechSettings,
    declared_names,
    model_names,
    served_hub_id,
    unlisted_model_names,
    voice_map,
)
from stagevisor.supervisor.http.openapi import OPERATIONS, Operation, document
from stagevisor.supervisor.http.request import (
    accepted_fields,
    answers_to,
    Served,
    SpeechRequest,
    parse_speech_request,
    read_json_body,
    requested_voice,
)
from stagevisor.supervisor.http.speech import (
    FALLBACK_SAMPLE_RATE,
    ClientGone,
    SpeechGateway,
    StreamAborted,
    status_of,
    synthesize,
)
from stagevisor.supervisor.http.stream import speech_session
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from stagevisor.supervisor.http.voices import (
    TakenNames,
    VoiceExists,
    VoiceNotRemovable,
    VoiceStore,
    VoiceStoreFull,
    VoiceStoreUnavailable,
    read_upload,
    voice_listing,
)

log = logging.getLogger("stagevisor.http")

TEXT_QUERY_FIELDS = (
    "model",
    "input",
    "voice",
    "instructions",
    "response_format",
    "stream_format",
    "language",
    "ref_text",
)
"""GET /v1/audio/speech parameters that stay strings; the others are read as JSON numbers and booleans."""


class SpeechDaemon(Protocol):
    """What the HTTP app needs from the daemon."""

    @property
    def plan(self) -> Plan:
        """The Plan served."""

    @property
    def gateway(self) -> SpeechGateway:
        """Where requests are admitted and started."""

    def topology(self) -> TopologyReport: ...
    def status(self) -> StatusReport: ...
    def voices(self) -> list[dict[str, Any]]:
        """The voices the executors declare: dicts with at least `id`."""

    @property
    def voice_names(self) -> Mapping[str, str]:
        """The config's `voices` map now (an apply may change it): a name clients send -> the model's voice."""


class SpeechService:
    """The served model as requests see it: its names, voices, uploaded voices and what it takes."""

    def __init__(self, daemon: SpeechDaemon, settings: SpeechSettings, store: VoiceStore | None) -> None:
        self.daemon = daemon
        self.settings = settings
        self.store = store

    def models(self) -> tuple[str, ...]:
        """The names GET /v1/models lists, the one requests default to first."""
        return model_names(self.daemon.plan.model, self.daemon.plan.model_path, self.settings)

    def unlisted_models(self) -> tuple[str, ...]:
        """Names accepted as `model` but not listed (--model-path as a local directory)."""
        return unlisted_model_names(self.daemon.plan.model, self.daemon.plan.model_path, self.settings)

    def served(self) -> Served:
        voices = self.daemon.voices()
        return Served(
            models=self.models(),
            unlisted_models=self.unlisted_models(),
            hub_id=served_hub_id(self.daemon.plan.model_path, self.settings),
            voices=voices,
            voice_map=voice_map(voices, self.daemon.voice_names),
            uploaded=self.store.get if self.store is not None else (lambda name: None),
            speech=self.settings.speech,
            sample_rate=self.settings.sample_rate,
        )

    def rate_hint_of(self, served: Served) -> int:
        return self.sample_rate_hint(served.voices)

    def sample_rate_hint(self, voices: list[dict[str, Any]]) -> int:
        rates = [int(v["sample_rate"]) for v in voices if v.get("sample_rate")]
        return rates[0] if rates else FALLBACK_SAMPLE_RATE

    async def parse(self, data: dict[str, Any]) -> tuple[SpeechRequest, Served]:
        """Check a request; off the event loop when it reads an uploaded voice or decodes reference audio."""
        served = self.served()
        voice = requested_voice(data)
        reads_files = data.get("ref_audio") is not None or (
            self.store is not None and isinstance(voice, str) and voice and voice not in declared_names(served.voices)
        )
        if reads_files:
            return await asyncio.to_thread(parse_speech_request, data, served), served
        return parse_speech_request(data, served), served

    def accepts(self) -> dict[str, Any]:
        """What a request to the model may carry (GET /v1/models)."""
        speech = self.settings.speech
        return {
            "fields": accepted_fields(speech),
            "clones": speech.clones,
            "instructions": speech.instructions,
            "seed": speech.seed,
            "seed_range": {"minimum": 0, "maximum": speech.seed_maximum} if speech.seed else None,
            "languages": list(speech.languages),
            "options": None
            if speech.options is None
            else {name: spec.model_dump() for name, spec in speech.options.items()},
            "response_formats": ["mp3", "opus", "aac", "flac", "wav", "pcm"],
            "sample_rates": {"minimum": 8000, "maximum": 48000, "default": self.settings.sample_rate},
        }


def create_app(
    daemon: SpeechDaemon,
    *,
    settings: SpeechSettings | None = None,
    voice_store: VoiceStore | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    extra_operations: Sequence[Operation] = (),
    authenticated: bool = False,
) -> Starlette:
    """The daemon's HTTP API; `extra_routes` are mounted beside the built-in ones (e.g. /metrics).

    `settings` name the model and shape its audio (SpeechSettings); `voice_store` keeps uploaded voices (None:
    uploads are off). `extra_operations` describe the extra routes in the OpenAPI document served at
    /openapi.json; `authenticated` declares the bearer token there (BearerAuthMiddleware checks the token).
    """
    created = int(time.time())
    service = SpeechService(daemon, settings or SpeechSettings(), voice_store)
    operations = [*OPERATIONS, *extra_operations]
    api_version = package_version()

    async def speak(request: Request, data: dict[str, Any] | None) -> Response:
        # Metered like the gRPC Synthesize call (requests by outcome, latency, time to first audio, RTF, gaps).
        metrics = daemon.gateway.metrics
        meter = metrics.start_request() if metrics is not None else None
        try:
            if data is None:
                data = await read_json_body(request)
            speech_request, served = await service.parse(data)
        except ApiError as error:
            if meter is not None:
                meter.finish(status_of(error))
            raise
        except ClientDisconnect:
            if meter is not None:
                meter.finish("CANCELLED")
            return Response(status_code=499)  # gone (or cut by --http-body-timeout) before its body was in
        except BaseException as error:
            if meter is not None:
                meter.finish("CANCELLED" if isinstance(error, asyncio.CancelledError) else "UNKNOWN")
            raise
        try:
            return await synthesize(
                request, daemon.gateway, speech_request, service.sample_rate_hint(served.voices), meter
            )
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; ends the ASGI call cleanly

    async def speech(request: Request) -> Response:
        return await speak(request, None)

    async def speech_get(request: Request) -> Response:
        if request.method == "HEAD":  # starlette routes HEAD to every GET route: here it would synthesize
            raise HTTPException(405)
        return await speak(request, query_fields(request, service.models()[0]))

    async def batch(request: Request) -> Response:
        items = batch_items(await read_json_body(request, MAX_BATCH_BODY_BYTES))
        metrics, held = daemon.gateway.metrics, HeldAudio()
        tasks = [
            asyncio.create_task(
                run_item(index, item, service.parse, daemon.gateway, service.rate_hint_of, metrics, held)
            )
            for index, item in enumerate(items)
        ]
        return batch_response(tasks, daemon.gateway.limits.stream_idle_timeout, held)

    async def speech_stream(websocket: WebSocket) -> None:
        await speech_session(websocket, service.parse, daemon.gateway, service.rate_hint_of, service.models()[0])

    def served_models() -> list[dict[str, Any]]:
        plan = daemon.plan
        names = service.models()
        # The model's key (`qwen3-tts`), as OpenAI's `root` names the base model: --model-path as typed would show
        # clients the daemon's directory layout, and it is one name among the ids, not the model they all stand for.
        root = plan.model or names[0]
        accepts = service.accepts()
        stand_in = any(stage.stand_in for stage in plan.stages)
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "stagevisor",
                "root": root,
                "accepts": accepts,
                # True when stand-in executors (the default voice, not the model's weights) run it.
                "stand_in": stand_in,
            }
            for name in names
        ]

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": served_models()})

    async def model(request: Request) -> Response:
        # OpenAI's SDKs call this as `client.models.retrieve(name)`; a hub id has a slash, hence `{model:path}`.
        name = request.path_params["model"]
        listed = served_models()
        found = next((entry for entry in listed if entry["id"] == name), None)
        if found is None and listed and answers_to(name, service.served()):
            # A name `model` takes though /v1/models leaves it out (--model-path as a local directory, a hub id in
            # another case): a client that checks the name it was given before speaking keeps working, and learns
            # nothing it did not send.
            found = {**listed[0], "id": name}
        if found is None:
            raise ApiError(
                404,
                f"model {name[:200]!r} is not served here; GET /v1/models lists the names this daemon answers to",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(found)

    async def voices(request: Request) -> Response:
        declared = daemon.voices()
        uploaded = await asyncio.to_thread(voice_store.list) if voice_store is not None else []
        listing = voice_listing(
            declared, voice_map(declared, daemon.voice_names), uploaded, clones=service.settings.speech.clones
        )
        return JSONResponse({"object": "list", "voices": listing})

    async def add_voice(request: Request) -> Response:
        if voice_store is None:
            raise ApiError(
                404, "voice uploads are off on this daemon (serve --voices-dir DIR turns them on)", code="not_found"
            )
        declared = daemon.voices()
        taken = TakenNames(declared_names(declared), voice_map(declared, daemon.voice_names))
        name, audio, transcript, seconds = await read_upload(request, taken)
        try:
            voice = await asyncio.to_thread(voice_store.add, name, audio, transcript, seconds)
        except VoiceExists as error:
            raise ApiError(409, error.message(), param="name", code="voice_exists") from None
        except VoiceStoreFull as error:
            raise ApiError(
                507, f"the daemon keeps at most {error} uploaded voices; DELETE one first", code="voice_store_full"
            ) from None
        except VoiceStoreUnavailable as error:
            raise _store_unavailable("upload", name, error) from None
        log.info("voice %r uploaded (%.1f s of audio)", name, seconds)
        # `object` and `name` as OpenAI's voice has them (its SDK's voices.create reads them), beside ours.
        created = {**voice.to_json(service.settings.speech.clones), "object": "audio.voice", "name": name}
        return JSONResponse(created, status_code=201)

    async def delete_voice(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            deleted = voice_store is not None and await asyncio.to_thread(voice_store.delete, name)
        except VoiceStoreUnavailable as error:
            raise _store_unavailable("delete", name, error) from None
        except VoiceNotRemovable as error:
            raise ApiError(
                409, f"voice {name!r} cannot be deleted: {error.held.reason}", param="name", code="voice_not_removable"
            ) from None
        if not deleted:
            raise ApiError(
                404,
                f"no uploaded voice is named {name[:80]!r} (GET /v1/audio/voices)",
                param="name",
                code="voice_not_found",
            )
        log.info("voice %r deleted", name)
        return JSONResponse({"id": name, "object": "audio.voice.deleted", "deleted": True})  # as OpenAI's

    async def version(request: Request) -> Response:
        return JSONResponse({"version": package_version(), "model": daemon.plan.model})

    async def health(request: Request) -> Response:
        status = daemon.status()
        return JSONResponse({"status": "ok", "state": status.state, "pid": status.pid})

    async def ready(request: Request) -> Response:
        status = daemon.status()
        not_ready = [{"name": g.name, "state": g.state} for g in status.groups if g.state != "READY"]
        body = {
            # As grpc.health.v1 answers: SERVING while every group has a READY worker (a replicated group: one
            # READY replica, so a replica restarting does not take the daemon out of rotation) and not draining.
            "ready": status.state == "SERVING",
            "state": status.state,
            "groups_not_ready": not_ready,
            "groups_ready": status.groups_ready,
            "groups_total": status.groups_total,
            "workers_ready": status.workers_ready,
            "workers_total": status.workers_total,
        }
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    async def topology(request: Request) -> Response:
        data = daemon.topology().to_json()  # what `stagevisor topology --format json` prints
        data["status"] = daemon.status().to_json()
        data["admission"] = daemon.gateway.admission.snapshot()
        return JSONResponse(data)

    async def playground(request: Request) -> Response:
        page = resources.files("stagevisor.supervisor.http").joinpath("playground.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def openapi(request: Request) -> Response:
        # The text limit is the one served now: stages declare theirs when their workers become READY.
        limit = daemon.gateway.max_text_chars
        return JSONResponse(
            document(
                operations,
                version=api_version,
                authenticated=authenticated,
                max_text_chars=limit,
                seed_maximum=service.settings.speech.seed_maximum,
            )
        )

    routes: list[BaseRoute] = [
        Route("/", playground, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/speech", speech_get, methods=["GET"]),
        Route("/v1/audio/speech/batch", batch, methods=["POST"]),
        WebSocketRoute("/v1/audio/speech/stream", speech_stream),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/v1/audio/voices", add_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", delete_voice, methods=["DELETE"]),
        Route("/version", version, methods=["GET"]),
        Route("/v1/topology", topology, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        *extra_routes,
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(ServerErrors)],
        # Not `Exception: ...` here: starlette re-raises after that handler, and uvicorn logs the error a
        # second time, without its request id. ServerErrors answers it and raises nothing on.
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
    )


UVICORN_INCOMPLETE = "ASGI callable returned without completing response."
"""What uvicorn logs, at ERROR, when an app returns mid-response; for a stream cut on purpose it is noise."""
_cut_on_purpose: contextvars.ContextVar[bool] = contextvars.ContextVar("cut_on_purpose", default=False)


class _QuietPurposefulCuts(logging.Filter):
    """Drops uvicorn's "returned without completing response" for a stream ServerErrors cut (the failure is
    already logged with its request id); one left incomplete any other way is still reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_cut_on_purpose.get() and record.getMessage() == UVICORN_INCOMPLETE)


_QUIET_CUTS = _QuietPurposefulCuts()


class ServerErrors:
    """An HTTP request that fails with an exception no route answered: one log record, and nothing raised on.

    Before its status line went out, an unexpected exception is a 500 naming
    its class and a request id (`_server_error`, which logs it under that id).
    After it, the response ends without its final chunk and uvicorn closes the
    connection, the only honest signal left: so for a stream that failed
    mid-body (StreamAborted, already logged) and for an unexpected exception.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        logging.getLogger("uvicorn.error").addFilter(_QUIET_CUTS)  # once: a logger holds a filter object once

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # a WebSocket session answers its own errors (stream.py)
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except StreamAborted:
            # uvicorn logs after this returns, in the same task: it sees the flag, another request does not.
            _cut_on_purpose.set(True)
        except Exception as error:  # noqa: BLE001 - logged with its id; raised on, uvicorn would log it again
            response = _server_error(Request(scope), error)
            if started:
                _cut_on_purpose.set(True)
            else:
                await response(scope, receive, send)


def query_fields(request: Request, default_model: str) -> dict[str, Any]:
    """GET /v1/audio/speech's query as a request body: numbers and booleans read as JSON, the model defaulted.

    A parameter given twice is refused (which one was meant is not ours to guess), and so is one whose
    %-escapes are not UTF-8 (`input=%ED%A0%80`, a lone surrogate), naming it; the lenient decoding of
    `request.query_params` would have turned it into U+FFFD and spoken that.
    """
    data: dict[str, Any] = {"model": default_model}
    given: set[str] = set()
    for key, value in _query_items(request.scope.get("query_string", b"")):
        if key in given:
            raise ApiError(400, f"query parameter {key!r} is given more than once", param=key, code="invalid_value")
        given.add(key)
        data[key] = value if key in TEXT_QUERY_FIELDS else _query_value(value)
    return data


def _query_items(query: bytes) -> list[tuple[str, str]]:
    """The query's (name, value) pairs in order, as Starlette reads them, but strict about UTF-8."""
    items: list[tuple[str, str]] = []
    for pair in query.decode("latin-1").split("&"):
        try:
            items += parse_qsl(pair, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            name = unquote_plus(pair.partition("=")[0], errors="replace")
            raise ApiError(
                400,
                f"query parameter {name!r} is not UTF-8 text once its %-escapes are decoded",
                param=name,
                code="invalid_value",
            ) from None
    return items


def _query_value(text: str) -> Any:
    """A number, a boolean or null as JSON reads it; anything else stays the text it is."""
    try:
        value = json.loads(text, parse_constant=lambda name: text)  # NaN and Infinity are not JSON numbers
    except (ValueError, RecursionError):  # "[[[[..." nested past Python's recursion limit is text too
        return text
    return value if value is None or isinstance(value, (bool, int, float)) else text


def _store_unavailable(action: str, name: str, error: VoiceStoreUnavailable) -> ApiError:
    """The error for a voice the store could not write: the operator's reason (with the path) goes to the log only."""
    log.error("voice %r: %s failed: %s", name, action, error.reason)
    if error.no_space:
        return ApiError(
            507, "the daemon's disk has no room for uploaded voices; try again later", code="insufficient_storage"
        )
    return ApiError(
        500,
        f"the daemon cannot {action} this voice: its voices directory is not usable (the daemon log says why)",
        type="server_error",
        code="voice_store_unavailable",
    )


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error.response()


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = f"no route {request.method} {request.url.path}; GET /openapi.json lists the routes this API serves"
    elif error.status_code == 405:
        allowed = _allowed_methods(request)
        message = f"{request.method} is not allowed on {request.url.path}; use {' or '.join(allowed)}"
        return ApiError(405, message, code="method_not_allowed", headers={"Allow": ", ".join(allowed)}).response()
    else:
        message = str(error.detail)
    return ApiError(error.status_code, message, code=_status_code(error.status_code), headers=error.headers).response()


def _status_code(status: int) -> str:
    """The code of an error Starlette raised itself: its status's name (404 `not_found`, 400 `bad_request`)."""
    try:
        return http.HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (starlette's Allow names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(request.url.path):
            methods |= route.methods
    methods.discard("HEAD")  # starlette adds it to every GET route; HEAD is not part of the API
    return sorted(methods)


def _server_error(request: Request, error: Exception) -> Response:
    """The 500 for an unexpected exception: its class and a fresh request id, under which the log has it."""
    failure = unexpected_failure(error)
    log.exception(
        "request %s: HTTP %s %s failed",
        failure.request_id,
        request.method,
        request.url.path,
        extra=promised(failure.request_id),
    )
    return ApiError(
        500,
        failure.public_message(),
        type="server_error",
        code="internal_error",
        headers={"X-Request-Id": failure.request_id},
    ).response()
