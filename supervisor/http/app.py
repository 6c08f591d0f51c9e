"""The ASGI application: routes of the OpenAI-compatible API, health, readiness, topology and the playground.

`create_app(daemon, extra_routes=...)` is the one place routes are added:
other parts of the daemon (metrics) pass theirs in `extra_routes`. The app
talks to the daemon only through `SpeechDaemon`, so tests can drive it with
a fake and the daemon's internals stay on their side.
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib import resources
from typing import Any, Sequence

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
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.names import SpeechSettings, voice_map
from stagevisor.supervisor.http.openapi import Operation, document
from stagevisor.supervisor.http.operations import OPERATIONS
from stagevisor.supervisor.http.query import query_fields
from stagevisor.supervisor.http.request import answers_to
from stagevisor.supervisor.http.body import read_json_body
from stagevisor.supervisor.http.server_errors import ServerErrors, api_error, http_error
from stagevisor.supervisor.http.service import SpeechDaemon, SpeechService
from stagevisor.supervisor.http.speech import ClientGone, status_of, synthesize
from stagevisor.supervisor.http.stream import speech_session
from stagevisor.supervisor.http.voices import (
    VoiceExists,
    VoiceNotRemovable,
    VoiceStore,
    VoiceStoreFull,
    VoiceStoreUnavailable,
    read_upload,
    taken_names,
    voice_listing,
)

log = logging.getLogger("stagevisor.http")


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
        taken = taken_names(declared, voice_map(declared, daemon.voice_names))
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
        silent = [{"name": g.name, "silent_s": g.silent_s} for g in status.groups if g.silent_s is not None]
        body = {
            # As grpc.health.v1 answers: SERVING while every group has a READY worker that answers its heartbeat (a
            # replicated group: one such replica, so a replica restarting or silent does not take the daemon out
            # of rotation) and not draining.
            "ready": status.state == "SERVING",
            "state": status.state,
            "groups_not_ready": not_ready,
            "workers_silent": silent,
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
        _without_head(Route("/v1/audio/speech", speech_get, methods=["GET"])),  # HEAD would synthesize
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
    app = Starlette(
        routes=routes,
        middleware=[Middleware(ServerErrors)],
        # Not `Exception: ...` here: starlette re-raises after that handler, and uvicorn logs the error a
        # second time, without its request id. ServerErrors answers it and raises nothing on.
        exception_handlers={ApiError: api_error, HTTPException: http_error},
    )
    # `/v1/audio/speech/` is no route: a 404 in the API's envelope, not starlette's bodiless 307 to the route
    # without the slash, whose Location names the daemon's own scheme and address (http:// behind a TLS proxy).
    app.router.redirect_slashes = False
    return app


def _without_head(route: Route) -> Route:
    """`route` without the HEAD starlette gives every GET route: a HEAD there is a 405 whose `Allow` omits it."""
    assert route.methods is not None
    route.methods.discard("HEAD")
    return route


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
