"""The standalone /metrics server (`serve --metrics HOST:PORT`): it serves, and leaves the daemon's logging alone."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from stagevisor.supervisor.metrics.http import serve_metrics

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


@pytest.fixture
def uvicorn_loggers():
    """The uvicorn loggers' handlers and propagation, put back afterwards whatever the server did to them."""
    saved = {
        name: (list(logging.getLogger(name).handlers), logging.getLogger(name).propagate) for name in UVICORN_LOGGERS
    }
    yield
    for name, (handlers, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.propagate = propagate


def test_the_metrics_server_serves_and_its_uvicorn_lines_go_through_the_daemons_handlers(uvicorn_loggers):
    registry = CollectorRegistry()
    Counter("stagevisor_probe", "a counter only this test has", registry=registry).inc()

    async def scenario() -> str:
        server = await serve_metrics(registry, "127.0.0.1:0")
        try:
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(server.url, timeout=10).read().decode())
        finally:
            await server.stop()
            await asyncio.wait_for(server.task, 10)
        return body

    assert "stagevisor_probe_total 1.0" in asyncio.run(scenario())
    # No handler of uvicorn's own: its records reach the root logger, in the daemon's format (access lines are off).
    assert all(logging.getLogger(name).handlers == [] for name in UVICORN_LOGGERS)
    assert logging.getLogger("uvicorn").propagate and logging.getLogger("uvicorn.error").propagate


def test_the_metrics_port_answers_get_metrics_alone(uvicorn_loggers):
    """Before: `GET /`, `GET /health` and `POST /metrics` were all 200 with the metrics, so a health check pointed at
    this port by mistake always passed."""
    import urllib.error

    async def scenario() -> list[int]:
        server = await serve_metrics(CollectorRegistry(), "127.0.0.1:0")
        base = server.url.removesuffix("/metrics")

        def status(path: str, method: str = "GET") -> int:
            try:
                with urllib.request.urlopen(urllib.request.Request(base + path, method=method), timeout=10) as reply:
                    return reply.status
            except urllib.error.HTTPError as error:
                return error.code

        try:
            return await asyncio.to_thread(
                lambda: [
                    status(p, m)
                    for p, m in (
                        ("/metrics", "GET"),
                        ("/metrics/", "GET"),
                        ("/health", "GET"),
                        ("/", "GET"),
                        ("/metrics", "POST"),
                    )
                ]
            )
        finally:
            await server.stop()
            await asyncio.wait_for(server.task, 10)

    assert asyncio.run(scenario()) == [200, 200, 404, 404, 405]


def test_idle_connections_to_the_metrics_port_are_capped_and_a_scrape_still_answers(uvicorn_loggers):
    """Connections that never send a request used to stay open for ever: each held one of the daemon's
    descriptors, which its workers, gRPC and the HTTP API share. Now the oldest idle ones make room."""
    import socket

    from stagevisor.supervisor.service import METRICS_MAX_CONNECTIONS, metrics_protocol
    from tests.integration.daemon_helpers import closed_by_server, poll_until

    opened = METRICS_MAX_CONNECTIONS + 24

    async def scenario() -> tuple[int, str]:
        registry = CollectorRegistry()
        Counter("stagevisor_probe", "a counter only this test has", registry=registry).inc()
        server = await serve_metrics(registry, "127.0.0.1:0", metrics_protocol())
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        idle: list[socket.socket] = []
        try:
            for _ in range(opened):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.setblocking(False)
                idle.append(sock)
            await asyncio.to_thread(
                poll_until,
                lambda: sum(closed_by_server(s) for s in idle) >= opened - METRICS_MAX_CONNECTIONS,
                timeout=30,
                message="the idle connections beyond the cap closed by the server",
            )
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(server.url, timeout=10).read().decode())
            return sum(closed_by_server(s) for s in idle), body
        finally:
            for sock in idle:
                sock.close()
            await server.stop()
            await asyncio.wait_for(server.task, 10)

    closed, body = asyncio.run(scenario())
    assert closed >= opened - METRICS_MAX_CONNECTIONS
    assert "stagevisor_probe_total 1.0" in body


def test_on_loopback_the_metrics_port_answers_loopback_names_only(uvicorn_loggers):
    """DNS rebinding: a page whose name was rebound to 127.0.0.1 sends its own name as Host; the HTTP API refused
    it, the standalone /metrics (no authentication) answered it."""
    from stagevisor.supervisor.service import metrics_guard, metrics_protocol

    def status(url: str, host: str) -> int:
        request = urllib.request.Request(url, headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    async def scenario() -> tuple[int, int]:
        address = "127.0.0.1:0"
        server = await serve_metrics(CollectorRegistry(), address, metrics_protocol(), metrics_guard(address))
        port = server.url.rsplit(":", 1)[1].split("/")[0]
        try:
            return await asyncio.to_thread(
                lambda: (status(server.url, f"evil.example:{port}"), status(server.url, f"localhost:{port}"))
            )
        finally:
            await server.stop()
            await asyncio.wait_for(server.task, 10)

    assert asyncio.run(scenario()) == (400, 200)


@pytest.mark.parametrize("address", ["127.0.0.1:0", "0.0.0.0:0"])
def test_the_metrics_port_serves_an_absolute_form_target_and_any_name_off_loopback(uvicorn_loggers, address):
    """RFC 9112 section 3.2.2: `GET http://HOST:PORT/metrics` was 404 `this port serves GET /metrics only`. Bound
    for other hosts, any Host name is answered, as the HTTP API answers them. `OPTIONS *` names what it serves."""
    import socket

    from stagevisor.supervisor.service import metrics_guard, metrics_protocol

    def exchange(port: int, line: str) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"{line} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer

    async def scenario() -> tuple[bytes, bytes, bytes]:
        server = await serve_metrics(CollectorRegistry(), address, metrics_protocol(), metrics_guard(address))
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        try:
            return await asyncio.to_thread(
                lambda: (
                    exchange(port, f"GET http://127.0.0.1:{port}/metrics"),
                    exchange(port, f"GET http://metrics.example:{port}/metrics"),
                    exchange(port, "OPTIONS *"),
                )
            )
        finally:
            await server.stop()
            await asyncio.wait_for(server.task, 10)

    loopback_name, other_name, server_wide = asyncio.run(scenario())
    assert server_wide.startswith(b"HTTP/1.1 204 ") and b"allow: GET, HEAD, OPTIONS\r\n" in server_wide
    assert loopback_name.startswith(b"HTTP/1.1 200 ")
    assert other_name.startswith(b"HTTP/1.1 400 " if address.startswith("127.") else b"HTTP/1.1 200 ")
