"""A request target in absolute form (`POST http://host:8000/v1/audio/speech HTTP/1.1`) read as its path.

RFC 9112 section 3.2.2: a server must accept the absolute form of a request
target, which a client sends to a proxy and may send to any server. uvicorn
puts the whole URI in the scope's `path`, so every route would answer 404.
`AbsoluteTarget` rewrites such a scope to the origin form (`/v1/audio/speech`)
and, as that section says, takes the target's authority in place of the
`Host` header, so the Host check sees the name the client addressed. `OPTIONS *`
(the asterisk form, asking about the server as a whole) answers 204 with the
methods the server serves in `Allow`; it was a 404 naming the route `/*`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from starlette.responses import Response

from stagevisor.supervisor.http.errors import ApiError, refuse

ABSOLUTE = re.compile(rb"(?i)(https?)://([^/]*)(/.*)?", re.DOTALL)
"""`scheme://authority/path` of an http(s) URI (the query is already apart, in `query_string`)."""
SERVER_METHODS = "GET, HEAD, POST, DELETE, OPTIONS"
"""What `OPTIONS *` answers by default: the methods some route of the HTTP API takes (HEAD: every GET route but
the speech URL, which would synthesize; OPTIONS: CORS preflights, and this)."""


def routed_path(scope: dict[str, Any]) -> str:
    """The path a request routes to: its target's path, an absolute-form target's included (`AbsoluteTarget` makes
    the same rewrite for the app behind it)."""
    found = ABSOLUTE.fullmatch(scope.get("raw_path") or scope["path"].encode("utf-8"))
    if found is None:
        return str(scope["path"])
    return unquote((found.group(3) or b"/").decode("latin-1"))


class AbsoluteTarget:
    """ASGI middleware: an HTTP request or WebSocket handshake whose target is an absolute http(s) URI is routed
    as its path, with its authority as `Host`; one whose authority is empty or carries userinfo
    (`http://user@host/`, which RFC 9110 section 4.2.4 says to treat as an error) gets 400 `invalid_request_target`.
    Any other request passes as it came."""

    def __init__(self, app: Any, methods: str = SERVER_METHODS) -> None:
        self.app = app
        self.methods = methods
        """What `OPTIONS *` names in `Allow`."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path") or scope["path"].encode("utf-8")
        if raw == b"*":
            await self.server_wide(scope, receive, send)
            return
        found = ABSOLUTE.fullmatch(raw)
        if found is None:
            await self.app(scope, receive, send)
            return
        authority, path = found.group(2), found.group(3) or b"/"
        if not authority or b"@" in authority:
            error = ApiError(
                400,
                f"the request target {raw[:200].decode('latin-1')!r} names no host, or names a user; send the "
                "path alone (/v1/audio/speech) or http://HOST:PORT/PATH",
                code="invalid_request_target",
            )
            await refuse(error, scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"host"]
        rewritten = {
            **scope,
            "raw_path": path,
            "path": unquote(path.decode("latin-1")),
            "headers": [(b"host", authority), *headers],
        }
        await self.app(rewritten, receive, send)

    async def server_wide(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The asterisk form (RFC 9112 section 3.2.4), which only OPTIONS takes: the methods the server serves, as
        its answer about the server as a whole; another method with it is 400 `invalid_request_target`."""
        if scope.get("type") == "http" and scope.get("method") == "OPTIONS":
            await Response(status_code=204, headers={"Allow": self.methods})(scope, receive, send)
            return
        error = ApiError(
            400,
            f"the request target '*' is only for OPTIONS, not {str(scope.get('method', 'GET'))[:20]}; send a path",
            code="invalid_request_target",
        )
        await refuse(error, scope, receive, send)
