"""An unexpected error in an HTTP route: a 500 naming its class and a request id the log also has, never its text."""

from __future__ import annotations

import logging

from starlette.testclient import TestClient

from stagevisor.supervisor.http.app import create_app
from tests.fakes import FakeSpeechDaemon

SECRET = "/var/lib/stagevisor/token=hunter2"


class BrokenDaemon(FakeSpeechDaemon):
    """A daemon whose topology report fails with an error no route expects."""

    def topology(self):
        raise OSError(f"cannot read {SECRET}")


def test_an_unexpected_error_in_a_route_is_a_500_with_its_class_and_a_request_id_the_log_has(caplog):
    client = TestClient(create_app(BrokenDaemon()), raise_server_exceptions=False)
    with caplog.at_level(logging.ERROR, logger="stagevisor.http"):
        response = client.get("/v1/topology")
    request_id = response.headers["x-request-id"]
    assert response.status_code == 500 and len(request_id) == 32
    assert response.json()["error"] == {
        "message": f"the daemon failed with OSError; the daemon log has the details (request {request_id})",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert f"request {request_id}: HTTP GET /v1/topology failed" in caplog.text and SECRET in caplog.text


def test_an_unexpected_error_in_a_route_is_one_log_record_and_is_not_raised_on_to_the_server(caplog):
    """starlette's handler for Exception raised the error on after answering: uvicorn then logged a second
    traceback ("Exception in ASGI application") without the request id. The test client raises whatever the
    app raises on, as uvicorn logs it."""
    client = TestClient(create_app(BrokenDaemon()))
    with caplog.at_level(logging.DEBUG):
        response = client.get("/v1/topology")
    request_id = response.headers["x-request-id"]
    logged = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert response.status_code == 500
    assert [r.getMessage() for r in logged] == [f"request {request_id}: HTTP GET /v1/topology failed"]


def test_an_unexpected_error_after_the_status_line_cuts_the_body_logged_once_with_its_id(caplog):
    """A streamed body that fails midway cannot become a 500: the body is cut (the client sees it end early),
    and the log has the error once, under its id."""
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def body():
        yield b"RIFF"
        raise OSError(f"cannot read {SECRET}")

    async def broken_stream(request):
        return StreamingResponse(body(), media_type="audio/wav")

    app = create_app(FakeSpeechDaemon(), extra_routes=[Route("/broken", broken_stream)])
    with caplog.at_level(logging.DEBUG):
        with TestClient(app).stream("GET", "/broken") as response:
            assert response.status_code == 200
            received = b"".join(response.iter_bytes())
    logged = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert received == b"RIFF" and len(logged) == 1
    assert logged[0].getMessage().endswith(": HTTP GET /broken failed") and SECRET in caplog.text


def test_a_route_with_a_trailing_slash_is_a_404_in_the_envelope_not_a_redirect():
    """`POST /v1/audio/speech/` was starlette's bodiless 307 to `http://<the daemon's own address>/v1/audio/speech`:
    behind a TLS proxy a redirect to plain HTTP on an internal address, and no error an SDK could show."""
    client = TestClient(create_app(FakeSpeechDaemon()), raise_server_exceptions=False)
    response = client.post("/v1/audio/speech/", json={"input": "Hi.", "voice": "alloy"}, follow_redirects=False)
    assert response.status_code == 404 and "location" not in response.headers
    assert response.json()["error"] == {
        "message": "no route POST /v1/audio/speech/; GET /openapi.json lists the routes this API serves (without a "
        "trailing '/')",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }


def test_every_405_the_api_sends_carries_allow():
    """RFC 9110 section 15.5.6: a 405 must name the methods allowed. The CORS preflight's 405 named none."""
    from stagevisor.supervisor.http.server import uvicorn_config
    from stagevisor.supervisor.http.settings import HttpSettings

    page = "https://app.example"
    api = create_app(FakeSpeechDaemon())
    client = TestClient(
        uvicorn_config(api, settings=HttpSettings(cors_origins=(page,))).app, base_url="http://127.0.0.1"
    )
    paths = {route.path.replace("{model:path}", "fake").replace("{name}", "someone") for route in api.routes}
    refused = []
    for path in sorted(paths):
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
            refused.append((path, method, client.request(method, path, headers={"Content-Length": "0"})))
            preflight = {"Origin": page, "Access-Control-Request-Method": method}
            refused.append((path, f"preflight {method}", client.options(path, headers=preflight)))
    answered = [(path, method, answer) for path, method, answer in refused if answer.status_code == 405]
    assert any(method == "preflight PUT" for _, method, _ in answered) and any(m == "PUT" for _, m, _ in answered)
    assert [(path, method) for path, method, answer in answered if not answer.headers.get("allow")] == []


def test_a_plain_http_request_to_the_websocket_route_is_told_to_upgrade_not_that_there_is_no_route():
    """`curl /v1/audio/speech/stream` got 404 `no route GET /v1/audio/speech/stream`: the route exists, as a
    WebSocket (RFC 9110 section 15.5.22: 426 with the protocol to upgrade to)."""
    client = TestClient(create_app(FakeSpeechDaemon()))
    for method in ("GET", "POST"):
        response = client.request(method, "/v1/audio/speech/stream")
        assert (response.status_code, response.json()["error"]["code"]) == (426, "upgrade_required")
        assert response.headers["upgrade"] == "websocket"
        assert "WebSocket handshake" in response.json()["error"]["message"]
    assert client.get("/v1/audio/speech/streams").status_code == 404


def test_allow_names_head_exactly_where_the_route_answers_it():
    """RFC 9110 section 10.2.1: Allow lists the methods the resource takes. Every 405 dropped HEAD, though
    `HEAD /health` (any GET route but the speech URL) answers 200: a client reading Allow was told it would not."""
    api = create_app(FakeSpeechDaemon())
    client = TestClient(api)
    paths = {route.path.replace("{model:path}", "fake").replace("{name}", "someone") for route in api.routes}
    paths.discard("/v1/audio/speech/stream")  # a WebSocket: a plain request is a 426
    checked = []
    for path in sorted(paths):
        refused = next(
            answer
            for method in ("PUT", "PATCH")
            if (answer := client.request(method, path, headers={"Content-Length": "0"})).status_code == 405
        )
        allowed = refused.headers["allow"].split(", ")
        head = client.head(path).status_code
        assert ("HEAD" in allowed) == (head != 405), (path, allowed, head)
        checked.append((path, "HEAD" in allowed))
    assert ("/health", True) in checked and ("/v1/audio/speech", False) in checked
    assert client.post("/health").headers["allow"] == "GET, HEAD"
