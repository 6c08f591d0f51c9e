"""Requests a web page of another site makes through a visitor's browser: refused unless configured.

`HostGuard` answers only the Host names the daemon is reached by (on a
loopback bind: loopback names), so a page whose name was rebound to the
daemon's address (DNS rebinding) is refused; --http-allowed-host adds names.
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

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from stagevisor.supervisor.http.errors import ApiError, refuse

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods a page may send cross-site without a preflight (POST) or that change state; GET and HEAD only read,
and what they return stays unreadable to the page without CORS."""
WORKING_GETS = frozenset({"/v1/audio/speech"})
"""GET routes that do work: a page of another site need not read the result to use them (an `<audio src>` of
`GET /v1/audio/speech` speaks its text through the visitor's loopback daemon, on the daemon's compute)."""
OTHER_SITES = frozenset({"cross-site", "same-site"})
"""`Sec-Fetch-Site` values of a request a page of another origin made: a media element's load sends no `Origin`,
but a browser says this much of where it came from."""
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
PRIVATE_NETWORK_REQUEST = "access-control-request-private-network"
"""The header of a browser's Private Network Access preflight: a public page asks to reach a private address."""


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
    named = host_and_port(host)
    return named is not None and named[0] == origin[0] and named[1] in (None, origin[1])


class OriginGuard:
    """ASGI middleware: a WebSocket handshake, a POST/PUT/PATCH/DELETE or a GET that does work (WORKING_GETS) whose
    `Origin` is another site's, and not one of `allowed_origins`, gets 403 `origin_not_allowed` before it reaches
    the app; so does such a GET with no `Origin` that a browser says another site made (`Sec-Fetch-Site`).

    Same-origin requests (the playground page served by the daemon) and
    requests without `Origin` (curl, SDKs, the CLI) pass.
    """

    def __init__(self, app: Any, allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(allowed_origins)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope.get("type")
        checked = kind == "websocket" or (
            kind == "http" and (scope.get("method") in UNSAFE_METHODS or scope.get("path") in WORKING_GETS)
        )
        origin = _header(scope, b"origin") if checked else None
        if origin is not None and not self.allows(origin, scope):
            await refuse(origin_not_allowed(origin), scope, receive, send)
            return
        site = _header(scope, b"sec-fetch-site") if checked and origin is None else None
        if site is not None and site.strip().lower() in OTHER_SITES and "*" not in self.allowed:
            error = ApiError(
                403,
                f"a web page of another site (Sec-Fetch-Site: {site.strip()[:40]}) may not use this API through its "
                "visitors' browsers; if that page is yours, give its media element `crossorigin` (its origin is "
                "then sent and checked) and serve with --http-cors-origin ORIGIN",
                code="origin_not_allowed",
            )
            await refuse(error, scope, receive, send)
            return
        await self.app(scope, receive, send)

    def allows(self, origin: str, scope: dict[str, Any]) -> bool:
        if origin in self.allowed or "*" in self.allowed:  # compared as CORSMiddleware compares them
            return True
        authority = origin_authority(origin)
        if authority is None:
            return False  # `null` (a sandboxed page, a local file) is no one's own origin
        host = _header(scope, b"host")
        return host is not None and same_origin(authority, host)


def origin_not_allowed(origin: str) -> ApiError:
    """The 403 for a request, or a CORS preflight, from a page of `origin`, which is not allowed."""
    return ApiError(
        403,
        f"a web page of {origin[:200]!r} may not use this API through its visitors' browsers; "
        f"if that page is yours, serve with --http-cors-origin {origin[:200]}",
        code="origin_not_allowed",
    )


class CodedCORS(CORSMiddleware):
    """Starlette's CORSMiddleware, whose refused preflights answer as the rest of the API does: OpenAI's error
    envelope, with the status and code the request itself would get (its default is a 400 text/plain
    "Disallowed CORS origin"). An allowed preflight, and every other request, is CORSMiddleware's own; a Private
    Network Access preflight is allowed from an origin the configuration names (`private_network_allowed`)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        if self.private_network_allowed(request_headers):
            asked = PRIVATE_NETWORK_REQUEST.encode("latin-1")
            rest = Headers(raw=[(k, v) for k, v in request_headers.raw if k.lower() != asked])
            answer = super().preflight_response(rest)
            if answer.status_code < 400:
                answer.headers["Access-Control-Allow-Private-Network"] = "true"
        else:
            answer = super().preflight_response(request_headers)
        if answer.status_code < 400:
            return answer
        error = self.refusal(request_headers)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-type")}
        refused = error.response()
        refused.headers.update(kept)  # Vary and the allowed methods, as CORSMiddleware's refusal has them
        return refused

    def private_network_allowed(self, request_headers: Headers) -> bool:
        """Whether a Private Network Access preflight (`Access-Control-Request-Private-Network`) is answered yes: only
        for an origin `--http-cors-origin` names itself. `*` lets any page call the API, but a public site reaching
        a daemon on the visitor's loopback or private network is what the browser asks about, so it must be named."""
        origin = request_headers.get("origin")
        asked = request_headers.get(PRIVATE_NETWORK_REQUEST)
        return asked is not None and origin is not None and origin != "*" and origin in self.allow_origins

    def refusal(self, request_headers: Headers) -> ApiError:
        """Why CORSMiddleware refused this preflight, as the API says it: the origin first, as OriginGuard does."""
        origin = request_headers["origin"]
        method = request_headers["access-control-request-method"]
        allowed = ", ".join(self.allow_methods)
        if not self.is_allowed_origin(origin):
            return origin_not_allowed(origin)
        if method not in self.allow_methods:
            return ApiError(
                405,
                f"a web page may not send {method[:40]!r} to this API through its visitors' browsers; send {allowed}",
                code="method_not_allowed",
                headers={"Allow": allowed},  # RFC 9110 section 15.5.6: a 405 names the methods that are allowed
            )
        # What is left is Private Network Access from an origin only `*` allows: every request header is allowed
        # (server.py's allow_headers), and a named origin's is answered (private_network_allowed).
        return ApiError(
            403,
            f"the browser asks whether a page of {origin[:200]!r} may reach this daemon on a private network, "
            "which --http-cors-origin '*' does not allow; if that page is yours, serve with --http-cors-origin "
            f"{origin[:200]}",
            code="private_network_not_allowed",
        )


class HostGuard:
    """ASGI middleware: a request whose Host header is not one of `allowed_hosts` (`*.example.com` patterns, `*`
    for any) gets 400 `invalid_host`, naming the option that lets the name in."""

    def __init__(self, app: Any, allowed_hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = [pattern.lower().strip("[]") for pattern in allowed_hosts]
        self.allow_any = "*" in self.hosts

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.allow_any or scope.get("type") not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        name = host_name(host) if host is not None else None
        if name is not None and any(_matches(name, pattern) for pattern in self.hosts):
            await self.app(scope, receive, send)
            return
        if name is None:
            message = f"the Host header {'is missing' if host is None else f'{host[:200]!r} is not a host name'}"
        else:
            message = (
                f"this daemon does not answer to the name {name[:200]!r} (Host header), so a page whose name was "
                "rebound to its address cannot reach it; if you reach the daemon by that name, serve with "
                f"--http-allowed-host {name[:200]}"
            )
        await refuse(ApiError(400, message, param="Host", code="invalid_host"), scope, receive, send)


def host_name(host: str) -> str | None:
    """The name of a Host header value (`LocalHost:8000` -> `localhost`, `[::1]:8000` -> `::1`); None if malformed."""
    named = host_and_port(host)
    return named[0] if named is not None else None


def host_and_port(host: str) -> tuple[str, int | None] | None:
    """A Host header value -> (its lower-case name, its port or None when it names none); None if malformed.

    A Host is a name and a port, nothing else: `evil.com@localhost` (urlsplit reads `evil.com` as userinfo and
    `localhost` as the name), a path, a query or a fragment is malformed."""
    if any(mark in host for mark in "@/?#\\"):
        return None
    try:
        parts = urlsplit(f"//{host.strip()}")
        port = parts.port  # a port that is not a number raises ValueError
    except ValueError:
        return None
    if not parts.hostname or (port is not None and port <= 0):
        return None
    return parts.hostname, port  # urlsplit lower-cases the name


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:]))


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name), None)
