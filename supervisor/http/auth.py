"""The HTTP API's bearer token: `BearerAuthMiddleware` refuses a request or WebSocket handshake without it."""

from __future__ import annotations

from typing import Any

from stagevisor.supervisor.http.errors import ApiError, refuse
from stagevisor.supervisor.security.server import HTTP_UNAUTHENTICATED_PATHS, Security, sole_authorization


class BearerAuthMiddleware:
    """ASGI middleware: HTTP requests without the endpoint's bearer token get 401 in the OpenAI error envelope.

    A WebSocket without it is refused before it is accepted: with the same 401 where the server supports
    the WebSocket denial response (uvicorn does), else by a close (the upgrade fails with 403).

    `/health`, `/ready` and the playground page (`/`, static) stay open. Wrap the app once:
    `BearerAuthMiddleware(app, security)`;
    with no token configured it passes every request through.
    """

    def __init__(self, app: Any, security: Security, open_paths: frozenset[str] = HTTP_UNAUTHENTICATED_PATHS) -> None:
        self.app = app
        self.security = security
        self.open_paths = open_paths

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or not self.security.authenticated or scope.get("path") in self.open_paths:
            await self.app(scope, receive, send)
            return
        header, reason = sole_authorization(
            [value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == b"authorization"]
        )
        if header is not None and self.security.check_bearer(header):
            await self.app(scope, receive, send)
            return
        error = ApiError(
            401,
            f"the request carried {reason}; send `Authorization: Bearer <API key>`",
            code="invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer realm="stagevisor"'},
        )
        await refuse(error, scope, receive, send, close_reason=f"unauthorized: {reason}")
