"""The Prometheus endpoint: `metrics_app()` (an ASGI app the HTTP API mounts at /metrics) and a
standalone server for `--metrics HOST:PORT`, run by uvicorn on the daemon's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any, Callable

from stagevisor.supervisor.addresses import host_port

log = logging.getLogger("stagevisor.metrics")


def metrics_app(registry: Any) -> Any:
    """An ASGI app answering GET with the registry in the Prometheus text format (gzip when asked)."""
    from prometheus_client import make_asgi_app

    return make_asgi_app(registry=registry)


def only_metrics(app: Any) -> Any:
    """`app` at GET (or HEAD) /metrics alone: the standalone port answers anything else 404 or 405, so a health
    check pointed at it by mistake (`/health`) fails instead of reading 200."""

    async def routed(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") == "/metrics" and scope["method"] in ("GET", "HEAD"):
            await app(scope, receive, send)
            return
        status, text = (
            (405, "this endpoint takes GET only\n")
            if scope["path"].rstrip("/") == "/metrics"
            else (404, "not found: this port serves GET /metrics only (the HTTP API, --http, serves /health)\n")
        )
        headers = [(b"content-type", b"text/plain; charset=utf-8")]
        if status == 405:
            headers.append((b"allow", b"GET, HEAD"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": text.encode()})

    return routed


def parse_host_port(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `[v6]:PORT` -> (host, port); ValueError naming the address."""
    parsed = host_port(address)
    if parsed is None:
        raise ValueError(f"--metrics {address!r} is not HOST:PORT, e.g. 127.0.0.1:9464 (port 0: any free port)")
    return parsed


@dataclass
class MetricsServer:
    """A running standalone /metrics endpoint."""

    url: str
    server: Any
    task: asyncio.Task

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 3.0)
        except asyncio.TimeoutError:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def serve_metrics(
    registry: Any, address: str, protocol: Any = "auto", guard: Callable[[Any], Any] | None = None
) -> MetricsServer:
    """Serve `metrics_app(registry)` on `address` (HOST:PORT) until `stop()`; OSError if it cannot bind.

    `protocol` is uvicorn's `http` setting and `guard` wraps the app: the daemon passes its HTTP API's guarded
    protocol and Host check, so idle or slow clients of this port cannot hold the daemon's descriptors, nor
    a page rebound to a loopback address read it.
    """
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the daemon's loop owns SIGTERM/SIGINT: handlers there only enqueue
            yield

    host, port = parse_host_port(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    bound = sock.getsockname()[1]
    # log_config=None: uvicorn's default would install its own handlers on the uvicorn loggers, process-wide, and
    # the HTTP API's lines (the same loggers) would then bypass the daemon's format and its repeat filter.
    app = only_metrics(metrics_app(registry))
    config = uvicorn.Config(
        app if guard is None else guard(app),
        http=protocol,
        lifespan="off",
        log_level="warning",
        access_log=False,
        log_config=None,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="metrics-http")
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if task.done():
        task.result()  # raises what stopped it
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{shown}:{bound}/metrics"
    log.info("metrics on %s", url)
    return MetricsServer(url, server, task)
