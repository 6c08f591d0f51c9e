"""What the HTTP API answers when a route fails: a 500 with a request id, starlette's errors in OpenAI's envelope."""

from __future__ import annotations

import contextvars
import http
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from stagevisor.supervisor.errors import unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.speech import StreamAborted

log = logging.getLogger("stagevisor.http")


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


async def api_error(request: Request, error: Exception) -> Response:
    """The handler of ApiError: its response."""
    assert isinstance(error, ApiError)
    return error.response()


async def http_error(request: Request, error: Exception) -> Response:
    """The handler of an HTTPException starlette raised itself (no route, a method not allowed): OpenAI's envelope."""
    assert isinstance(error, HTTPException)
    if error.status_code == 404 and _websocket_route(request):
        return ApiError(
            426,
            f"{request.url.path} is a WebSocket: open it with a WebSocket handshake (ws:// or wss://, "
            "`Upgrade: websocket`), not a plain HTTP request",
            code="upgrade_required",
            headers={"Upgrade": "websocket", "Connection": "Upgrade"},
        ).response()
    if error.status_code == 404:
        message = f"no route {request.method} {request.url.path}; GET /openapi.json lists the routes this API serves"
        if request.url.path != "/" and request.url.path.endswith("/"):
            message = f"{message} (without a trailing '/')"
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


def _websocket_route(request: Request) -> bool:
    """Whether the path is a WebSocket route's (starlette answers an HTTP request there as no route at all)."""
    return any(
        isinstance(route, WebSocketRoute) and route.path_regex.match(request.url.path) for route in request.app.routes
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (starlette's Allow names only the first route's), HEAD
    included where a GET route answers it (RFC 9110 section 10.2.1: Allow lists the methods the resource takes)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(request.url.path):
            methods |= route.methods
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
