"""A request target in absolute form (`POST http://host:8000/v1/audio/speech HTTP/1.1`) read as its path.

RFC 9112 section 3.2.2: a server must accept the absolute form of a request
target, which a client sends to a proxy and may send to any server. uvicorn
puts the whole URI in the scope's `path`, so every route would answer 404.
`AbsoluteTarget` rewrites such a scope to the origin form (`/v1/audio/speech`)
and, as that section says, takes the target's authority in place of the
`Host` header, so the Host check sees the name the client addressed.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from stagevisor.supervisor.http.errors import ApiError, refuse

ABSOLUTE = re.compile(rb"(?i)(https?)://([^/]*)(/.*)?", re.DOTALL)
"""`scheme://authority/path` of an http(s) URI (the query is already apart, in `query_string`)."""


class AbsoluteTarget:
    """ASGI middleware: an HTTP request or WebSocket handshake whose target is an absolute http(s) URI is routed
    as its path, with its authority as `Host`; one whose authority is empty or carries userinfo
    (`http://user@host/`, which RFC 9110 section 4.2.4 says to treat as an error) gets 400 `invalid_request_target`.
    Any other request passes as it came."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path") or scope["path"].encode("utf-8")
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
