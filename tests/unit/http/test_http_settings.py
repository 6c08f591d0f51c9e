"""The HTTP server's settings: connection limits, the descriptor budget, the Host check and CORS (no sockets)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from stagevisor.supervisor.http.connections import MAX_HTTP_CONNECTIONS, MIN_HTTP_CONNECTIONS, fd_budget
from stagevisor.supervisor.http.server import uvicorn_config
from stagevisor.supervisor.http.settings import ConnectionLimits, HttpSettings, default_allowed_hosts


def app() -> Starlette:
    async def hello(request):
        return PlainTextResponse("hi")

    return Starlette(routes=[Route("/hello", hello, methods=["GET", "POST"])])


@pytest.mark.parametrize("field", ["header_timeout", "body_timeout", "keep_alive_timeout"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_timeouts_must_be_positive_and_finite(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a number of seconds > 0"):
        ConnectionLimits(**{field: value})


def test_max_connections_must_be_positive():
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        ConnectionLimits(max_connections=0)


def test_the_descriptor_budget_keeps_room_for_workers_and_gives_http_half_of_the_rest():
    budget = fd_budget(256, workers=1)
    assert budget.reserved == 76 and budget.http_connections == 90
    assert budget.reserved + budget.http_connections < 256
    assert fd_budget(256, workers=10).http_connections < budget.http_connections
    assert fd_budget(64, workers=4).http_connections == MIN_HTTP_CONNECTIONS
    assert fd_budget(1 << 20, workers=1).http_connections == MAX_HTTP_CONNECTIONS


def test_a_descriptor_limit_below_what_the_daemon_needs_says_so_and_how_to_raise_it():
    """`ulimit -n 40` with two workers: 64 + 2 x 12 reserved and 8 HTTP connections need 96."""
    short = fd_budget(40, workers=2)
    assert short.short and short.needed == 96
    assert "below the 96 this daemon needs" in short.describe() and "ulimit -n" in short.describe()
    enough = fd_budget(96, workers=2)
    assert not enough.short and "kept for gRPC" in enough.describe()


@pytest.mark.parametrize(
    "bind,expected",
    [("127.0.0.1", ["localhost", "127.0.0.1", "::1", "[::1]"]), ("::1", None), ("localhost", None), ("0.0.0.0", ["*"])],
)
def test_loopback_binds_accept_loopback_names_only_by_default(bind, expected):
    hosts = default_allowed_hosts(bind)
    assert hosts == (expected or default_allowed_hosts("127.0.0.1"))


def test_a_foreign_host_header_is_refused_on_a_loopback_bind():
    config = uvicorn_config(app(), bind_host="127.0.0.1")
    assert TestClient(config.app, base_url="http://evil.example").get("/hello").status_code == 400
    assert TestClient(config.app, base_url="http://127.0.0.1:8000").get("/hello").status_code == 200
    assert TestClient(config.app, base_url="http://localhost:8000").get("/hello").status_code == 200


def test_configured_hosts_replace_the_default():
    config = uvicorn_config(app(), bind_host="0.0.0.0", settings=HttpSettings(allowed_hosts=("tts.example.com",)))
    assert TestClient(config.app, base_url="http://tts.example.com").get("/hello").status_code == 200
    assert TestClient(config.app, base_url="http://other.example.com").get("/hello").status_code == 400


def test_cors_is_off_unless_origins_are_configured():
    preflight = {"Origin": "https://app.example.com", "Access-Control-Request-Method": "POST"}
    plain = TestClient(uvicorn_config(app()).app, base_url="http://127.0.0.1")
    response = plain.get("/hello", headers={"Origin": "https://app.example.com"})
    assert "access-control-allow-origin" not in response.headers
    assert "access-control-allow-origin" not in plain.options("/hello", headers=preflight).headers
    settings = HttpSettings(cors_origins=("https://app.example.com",))
    cors = TestClient(uvicorn_config(app(), settings=settings).app, base_url="http://127.0.0.1")
    answer = cors.options("/hello", headers=preflight)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "https://app.example.com"
    other = cors.options("/hello", headers={**preflight, "Origin": "https://evil.example"})
    assert other.headers.get("access-control-allow-origin") != "https://evil.example"


@pytest.mark.parametrize(
    "origin", ["https://app.example.com/", "app.example.com", "https://app.example.com/page", "ftp://x", "not a url"]
)
def test_a_cors_origin_no_browser_would_send_is_refused_at_start(origin):
    """Before: `--http-cors-origin https://app.example.com/` started, and CORS (which compares origins as strings)
    then refused every request from that page without a word."""
    with pytest.raises(ValueError, match=r"cors_origin .* is not an origin as a browser sends it"):
        HttpSettings(cors_origins=(origin,))


@pytest.mark.parametrize("origin", ["*", "https://app.example.com", "http://localhost:3000", "http://[::1]:8080"])
def test_an_origin_as_a_browser_sends_it_is_accepted(origin):
    assert HttpSettings(cors_origins=(origin,)).cors_origins == (origin,)
