"""Requests a web page of another site makes through a visitor's browser: refused unless --http-cors-origin names it.

The browser's same-origin policy does not protect a WebSocket (any page may
open one to `ws://127.0.0.1:8000` and read what comes back) nor a form POST
(a multipart upload needs no CORS preflight). A browser names the page's
origin in the `Origin` header of both; `OriginGuard` refuses the ones that
are neither the daemon's own origin (its playground page) nor a configured
CORS origin. Clients that are not browsers send no `Origin` and pass.
"""

from __future__ import annotations

from typing import Any, Iterable
from urllib.parse import urlsplit

from stagevisor.supervisor.http.errors import ApiError

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods a page may send cross-site without a preflight (POST) or that change state; GET and HEAD only read,
and what they return stays unreadable to the page without CORS."""
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def origin_authority(origin: str) -> tuple[str, int] | None:
    """`https://Tts.Example.com` -> ("tts.example.com", 443); None for `null` and anything that is not scheme://host."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname.lower(), port


def same_origin(origin: tuple[str, int], host: str) -> bool:
    """Whether a Host header (`localhost:8000`, `[::1]:8000`, `tts.example.com`) names `origin`'s host and port.

    A Host without a port (the daemon behind a proxy on the scheme's default
    port, TLS ended there) matches on the name alone.
    """
    try:
        parts = urlsplit(f"//{host.strip()}")
        port = parts.port
    except ValueError:
        return False
    if not parts.hostname or parts.hostname.lower() != origin[0]:
        return False
    return port is None or port == origin[1]


class OriginGuard:
    """ASGI middleware: a WebSocket handshake or a POST/PUT/PATCH/DELETE whose `Origin` is another site's, and
    not one of `allowed_origins`, gets 403 `origin_not_allowed` before it reaches the app.

    Same-origin requests (the playground page served by the daemon) and
    requests without `Origin` (curl, SDKs, the CLI) pass.
    """

    def __init__(self, app: Any, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed_origins)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        checked = kind == "websocket" or (kind == "http" and scope.get("method") in UNSAFE_METHODS)
        origin = _header(scope, b"origin") if checked else None
        if origin is None or self.allows(origin, scope):
            await self.app(scope, receive, send)
            return
        error = ApiError(
            403,
            f"a web page of {origin[:200]!r} may not use this API through its visitors' browsers; "
            f"if that page is yours, serve with --http-cors-origin {origin[:200]}",
            code="origin_not_allowed",
        )
        if kind == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": "origin not allowed"})
            return
        await error.response()(scope, receive, send)  # for a WebSocket: the handshake's HTTP denial response

    def allows(self, origin: str, scope: dict[str, Any]) -> bool:
        if origin in self.allowed or "*" in self.allowed:  # compared as CORSMiddleware compares them
            return True
        authority = origin_authority(origin)
        if authority is None:
            return False  # `null` (a sandboxed page, a local file) is no one's own origin
        host = _header(scope, b"host")
        return host is not None and same_origin(authority, host)


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name), None)
