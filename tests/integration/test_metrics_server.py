"""The standalone /metrics server (`serve --metrics HOST:PORT`): it serves, and leaves the daemon's logging alone."""

from __future__ import annotations

import asyncio
import logging
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
