"""A request whose body is framed two ways, by Content-Length and by Transfer-Encoding, is refused.

RFC 9112 section 6.3: such a message may be an attempt at request smuggling
(a proxy in front reads one length, the server another), and a server must
close the connection after answering it. h11 reads the body by
Transfer-Encoding and keeps the connection for the next request, so what a
proxy took for the start of the next request could be read as part of this
one, or the other way round. `AmbiguousFraming` answers 400 with
`Connection: close` before the app sees the request.
"""

from __future__ import annotations

from typing import Any

from stagevisor.supervisor.http.errors import ApiError, refuse


class AmbiguousFraming:
    """ASGI middleware: an HTTP request with both `Content-Length` and `Transfer-Encoding` gets 400
    `invalid_http_request` and its connection closed; any other request passes."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        names = {key.lower() for key, _ in scope.get("headers", ())} if scope.get("type") == "http" else set()
        if b"content-length" in names and b"transfer-encoding" in names:
            error = ApiError(
                400,
                "the request gives both Content-Length and Transfer-Encoding, so its body has two lengths; send one",
                code="invalid_http_request",
                headers={"Connection": "close"},
            )
            await refuse(error, scope, receive, send)
            return
        await self.app(scope, receive, send)
