"""A request target in absolute form (RFC 9112 section 3.2.2) is routed as its path, its authority taken as Host."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stagevisor.supervisor.http.server import uvicorn_config
from stagevisor.supervisor.http.settings import HttpSettings


def app() -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path, "query": request.url.query, "host": request.headers["host"]})

    return Starlette(routes=[Route("/v1/audio/speech", echo, methods=["GET", "POST"])])


def served_messages(served: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """What the ASGI app sends for one request with an empty body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(served(scope, receive, send))
    return sent


def call(target: bytes, host: bytes = b"127.0.0.1:8000", method: str = "POST") -> tuple[int, dict[str, Any]]:
    """One request through the server's middleware stack (loopback bind: the Host check is on), by its raw target
    as uvicorn puts it in the scope."""
    served = uvicorn_config(app(), settings=HttpSettings()).app
    raw_path, _, query = target.partition(b"?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": raw_path.decode("ascii"),
        "raw_path": raw_path,
        "root_path": "",
        "query_string": query,
        "headers": [(b"host", host), (b"content-length", b"0")],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5000),
    }
    sent = served_messages(served, scope)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if sent[0]["status"] != 404 else {}


@pytest.mark.parametrize(
    "target",
    [
        b"http://127.0.0.1:8000/v1/audio/speech",
        b"HTTP://127.0.0.1:8000/v1/audio/speech",
        b"https://localhost/v1/audio/speech",
    ],
)
def test_an_absolute_form_target_is_routed_as_its_path(target):
    status, body = call(target)
    assert status == 200, body
    assert body["path"] == "/v1/audio/speech"


def test_the_query_and_escapes_of_an_absolute_target_are_kept():
    status, body = call(b"http://127.0.0.1:8000/v1/audio/%73peech?input=hi")
    assert (status, body["path"], body["query"]) == (200, "/v1/audio/speech", "input=hi")


def test_the_targets_authority_replaces_the_host_header():
    """RFC 9112: the server ignores Host for an absolute target; the Host check sees the name the client used."""
    status, body = call(b"http://localhost:8000/v1/audio/speech", host=b"evil.example")
    assert (status, body["host"]) == (200, "localhost:8000")
    status, body = call(b"http://evil.example/v1/audio/speech", host=b"127.0.0.1:8000")
    assert (status, body["error"]["code"]) == (400, "invalid_host")


@pytest.mark.parametrize("target", [b"http:///v1/audio/speech", b"http://user@127.0.0.1:8000/v1/audio/speech"])
def test_an_absolute_target_without_a_host_or_with_a_user_is_refused(target):
    status, body = call(target)
    assert (status, body["error"]["code"]) == (400, "invalid_request_target")


def test_an_origin_form_target_is_unchanged():
    assert call(b"/v1/audio/speech") == (200, {"path": "/v1/audio/speech", "query": "", "host": "127.0.0.1:8000"})
    assert call(b"/http://127.0.0.1:8000/v1/audio/speech")[0] == 404  # a path that only holds a URI: no route


def asterisk(method: str) -> tuple[int, dict[bytes, bytes], bytes]:
    """A request whose target is `*`, as uvicorn puts it in the scope: (status, headers, body)."""
    served = uvicorn_config(app(), settings=HttpSettings()).app
    scope = {
        "type": "http",
        "method": method,
        "path": "*",
        "raw_path": b"*",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
    }
    sent = served_messages(served, scope)
    return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_options_asterisk_is_answered_for_the_server_and_another_method_with_it_refused():
    """`OPTIONS * HTTP/1.1` (RFC 9112 section 3.2.4) got 404 `no route OPTIONS /*`."""
    status, headers, _ = asterisk("OPTIONS")
    assert (status, headers[b"allow"]) == (204, b"GET, HEAD, POST, DELETE, OPTIONS")
    refused, _, body = asterisk("GET")
    assert (refused, json.loads(body)["error"]["code"]) == (400, "invalid_request_target")
