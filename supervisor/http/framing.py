"""Request bodies and the connection: one framed two ways is refused; one left unread closes the connection.

RFC 9112 section 6.3: such a message may be an attempt at request smuggling
(a proxy in front reads one length, the server another), and a server must
close the connection after answering it. h11 reads the body by
Transfer-Encoding and keeps the connection for the next request, so what a
proxy took for the start of the next request could be read as part of this
one, or the other way round. `AmbiguousFraming` answers 400 with
`Connection: close` before the app sees the request.

An answer that starts before the request's body was read (a 415 for the wrong
Content-Type, a 401, a 404) left the connection open, and uvicorn then read
and dropped the whole body to reach the next request: a client declaring
100 MB sent all of it. `UnreadBody` closes the connection with such an answer
where what is left may be large (more than UNREAD_LIMIT declared, or chunked).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import MutableHeaders

from stagevisor.supervisor.http.errors import ApiError, refuse
from stagevisor.supervisor.numbers import whole_number

UNREAD_LIMIT = 64 * 1024
"""A body left unread up to this size is read and dropped, keeping the connection (uvicorn buffers this much before
it stops reading); beyond it, or chunked (its size unknown), the answer closes the connection."""


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


class UnreadBody:
    """ASGI middleware: an HTTP answer that starts before the request's body was read to its end, where that body
    is declared over UNREAD_LIMIT or chunked, carries `Connection: close`, so the connection ends with it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not _large_body(scope):
            await self.app(scope, receive, send)
            return
        read = False

        async def reading() -> Any:
            nonlocal read
            message = await receive()
            read = read or message["type"] == "http.disconnect" or not message.get("more_body", False)
            return message

        async def answering(message: Any) -> None:
            if message["type"] == "http.response.start" and not read:
                MutableHeaders(scope=message)["Connection"] = "close"
            await send(message)

        await self.app(scope, reading, answering)


def _large_body(scope: dict[str, Any]) -> bool:
    headers = {key.lower(): value for key, value in scope.get("headers", ())}
    if b"transfer-encoding" in headers:
        return True
    declared = headers.get(b"content-length")
    size = whole_number(declared.decode("latin-1")) if declared is not None else None
    return size is not None and size > UNREAD_LIMIT
