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
from importlib import metadata, resources
from typing import Any, Protocol, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.openapi import OPERATIONS, Operation, document
from stagevisor.supervisor.http.speech import (
    FALLBACK_SAMPLE_RATE,
    ClientGone,
    StreamAborted,
    parse_speech_request,
    read_json_body,
    status_of,
    synthesize,
)

log = logging.getLogger("stagevisor.http")


class SpeechDaemon(Protocol):
    """What the HTTP app needs from the daemon."""

    plan: Any
    """The Plan served (`model`, `model_path`)."""
    gateway: Any
    """`submit(request) -> RequestHandle` and `admission`."""

    def topology(self) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...
    def voices(self) -> list[dict[str, Any]]:
        """The voices the executors declare: dicts with at least `id`."""


def served_models(daemon: SpeechDaemon) -> tuple[str, ...]:
    """The names `model` may take: the model's key, then its path."""
    names = [daemon.plan.model, getattr(daemon.plan, "model_path", None)]
    return tuple(dict.fromkeys(n for n in names if n))


def create_app(
    daemon: SpeechDaemon,
    *,
    extra_routes: Sequence[BaseRoute] = (),
    extra_operations: Sequence[Operation] = (),
    authenticated: bool = False,
) -> Starlette:
    """The daemon's HTTP API; `extra_routes` are mounted beside the built-in ones (e.g. /metrics).

    `extra_operations` describe the extra routes in the OpenAPI document served at /openapi.json;
    `authenticated` declares the bearer token there (the token itself is checked by BearerAuthMiddleware).
    """
    created = int(time.time())
    openapi_document = document(
        [*OPERATIONS, *extra_operations], version=package_version(), authenticated=authenticated
    )

    async def speech(request: Request) -> Response:
        # Metered like the gRPC Synthesize call (requests by outcome, latency, time to first audio, RTF, gaps).
        metrics = getattr(daemon.gateway, "metrics", None)
        meter = metrics.start_request() if metrics is not None else None
        try:
            data = await read_json_body(request)
            voices = daemon.voices()
            speech_request = parse_speech_request(data, models=served_models(daemon), voices=voices)
        except ApiError as error:
            if meter is not None:
                meter.finish(status_of(error))
            raise
        except BaseException as error:
            if meter is not None:
                gone = isinstance(error, (ClientDisconnect, asyncio.CancelledError))
                meter.finish("CANCELLED" if gone else "UNKNOWN")
            raise
        rates = [int(v["sample_rate"]) for v in voices if v.get("sample_rate")]
        try:
            return await synthesize(
                request, daemon.gateway, speech_request, rates[0] if rates else FALLBACK_SAMPLE_RATE, meter
            )
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; ends the ASGI call cleanly

    async def models(request: Request) -> Response:
        plan = daemon.plan
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": plan.model,
                        "object": "model",
                        "created": created,
                        "owned_by": "stagevisor",
                        "root": getattr(plan, "model_path", None) or plan.model,
                    }
                ],
            }
        )

    async def voices(request: Request) -> Response:
        return JSONResponse({"voices": daemon.voices()})

    async def health(request: Request) -> Response:
        status = daemon.status()
        return JSONResponse({"status": "ok", "state": status["state"], "pid": status["pid"]})

    async def ready(request: Request) -> Response:
        status = daemon.status()
        not_ready = [{"name": g["name"], "state": g["state"]} for g in status["groups"] if g["state"] != "READY"]
        draining = status["state"] in ("STOPPING", "STOPPED")
        body = {
            "ready": not not_ready and not draining,
            "state": status["state"],
            "groups_not_ready": not_ready,
            "groups_ready": status["groups_ready"],
            "groups_total": status["groups_total"],
        }
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    async def topology(request: Request) -> Response:
        data = daemon.topology()
        data["status"] = daemon.status()
        data["admission"] = daemon.gateway.admission.snapshot()
        return JSONResponse(data)

    async def playground(request: Request) -> Response:
        page = resources.files("stagevisor.supervisor.http").joinpath("playground.html").read_text(encoding="utf-8")
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document)

    routes: list[BaseRoute] = [
        Route("/", playground, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/audio/voices", voices, methods=["GET"]),
        Route("/v1/topology", topology, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        *extra_routes,
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(CloseTruncatedStreams)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
    )


def package_version() -> str:
    """The installed stagevisor's version (the OpenAPI document's `info.version`)."""
    try:
        return metadata.version("stagevisor")
    except metadata.PackageNotFoundError:
        return "0"


class CloseTruncatedStreams:
    """A request that fails after its 200 went out ends without the final chunk: the client sees a cut body.

    uvicorn closes a connection whose app returned mid-response, which is the
    only honest signal left once the status line is sent.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except StreamAborted:
            pass


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error.response()


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see the README for the HTTP API"
    elif error.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(error.detail)
    return ApiError(
        error.status_code, message, code="not_found" if error.status_code == 404 else None, headers=error.headers
    ).response()


async def _server_error(request: Request, error: Exception) -> Response:
    log.exception("HTTP %s %s failed", request.method, request.url.path)
    return ApiError(
        500,
        f"internal error ({type(error).__name__}); the daemon log has the details",
        type="server_error",
        code="internal_error",
    ).response()
