"""uvicorn embedded in the daemon's event loop: bind, serve as a task, stop on `should_exit`.

`uvicorn_config()` is the one place the server's settings are made (TLS and
authentication settings go there). The socket is bound here, before serving,
so a port in use is a DaemonError at startup and port 0 reports the port the
kernel chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import uvicorn


from stagevisor.supervisor.http.auth import BearerAuthMiddleware
from stagevisor.supervisor.http.framing import AmbiguousFraming
from stagevisor.supervisor.http.connections import MAX_HTTP_CONNECTIONS, fd_budget, guarded_protocol, nofile_limit
from stagevisor.supervisor.http.origins import CodedCORS, HostGuard, OriginGuard
from stagevisor.supervisor.http.settings import HttpSettings
from stagevisor.supervisor.http.targets import AbsoluteTarget
from stagevisor.supervisor.addresses import Listener, host_port
from stagevisor.supervisor.security.server import Security

if TYPE_CHECKING:  # the app (and its starlette routes) loads when the server starts
    from starlette.routing import BaseRoute

    from stagevisor.supervisor.http.openapi import Operation
    from stagevisor.supervisor.http.service import SpeechDaemon
    from stagevisor.supervisor.http.names import SpeechSettings
    from stagevisor.supervisor.http.voices import VoiceStore

log = logging.getLogger("stagevisor.http")

WS_MAX_MESSAGE_BYTES = 256 * 1024
"""Largest WebSocket message a client may send (a text piece of 20,000 characters is at most 80 KB of UTF-8)."""
GRACEFUL_SHUTDOWN = 5
"""Seconds open connections get once the daemon has drained and stopped its workers; those still open then are
cut (HttpServer.stop), as if their clients had gone."""
CUT_GRACE = 2
"""Seconds the cut connections' responses get to end before uvicorn cancels them (an ERROR traceback each)."""


class HttpAddressError(ValueError):
    """`--http` is not HOST:PORT or `none`."""


def parse_http_address(value: str) -> tuple[str, int] | None:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) -> (host, port); `none` or `off` -> None."""
    text = value.strip()
    if text.lower() in ("none", "off", ""):
        return None
    parsed = host_port(text)
    if parsed is None:
        raise HttpAddressError(f"--http {value!r} is not HOST:PORT (e.g. 127.0.0.1:8000) or 'none'")
    return parsed


_LEVELS = ["debug", "info", "warning", "error", "critical"]


def uvicorn_config(
    app: Any,
    *,
    log_level: str = "info",
    security: Security | None = None,
    settings: HttpSettings | None = None,
    bind_host: str = "127.0.0.1",
    max_connections: int = MAX_HTTP_CONNECTIONS,
) -> uvicorn.Config:
    """The uvicorn settings of the daemon's HTTP server: TLS and the bearer token from `security`, the
    connection limits, accepted Host names and CORS origins from `settings`.

    Middleware order, outermost first: a body framed two ways refused (framing.py), an absolute-form target read
    as its path and authority (targets.py), the Host check (a rebinding page is refused before anything runs),
    CORS (a preflight carries no token), the Origin check (a WebSocket or form POST from another site's page),
    the bearer token, the app.
    """
    security = security or Security()
    settings = settings or HttpSettings()
    debug = log_level.lower() == "debug"
    wrapped: Any = OriginGuard(BearerAuthMiddleware(app, security), settings.cors_origins)
    if settings.cors_origins:
        wrapped = CodedCORS(
            wrapped,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],  # DELETE: /v1/audio/voices/{name}
            # Any header the page asks for: the openai SDKs send their own (X-Stainless-Lang, -Retry-Count, ...,
            # a set that grows by release), and a preflight that refuses one stops the request in the browser.
            allow_headers=["*"],
            # x-should-retry: the openai SDKs read it (a 504 says not to retry); hidden, a page's SDK retries anyway.
            expose_headers=["x-request-id", "x-sample-rate", "retry-after", "x-should-retry"],
        )
    hosts = settings.hosts_for(bind_host)
    if hosts != ["*"]:
        wrapped = HostGuard(wrapped, hosts)
    wrapped = AmbiguousFraming(AbsoluteTarget(wrapped))
    # log_config=None: uvicorn's loggers propagate to the daemon's logging setup instead of replacing it.
    return uvicorn.Config(
        wrapped,
        http=guarded_protocol(settings.limits, settings.limits.max_connections or max_connections),
        timeout_keep_alive=settings.limits.keep_alive_timeout,  # type: ignore[arg-type]  # a float works
        lifespan="off",
        log_config=None,
        # uvicorn's own INFO lines ("Started server process", one per request with access_log)
        # are noise to an operator; --log-level debug shows them.
        log_level="debug" if debug else max(log_level.lower(), "warning", key=_LEVELS.index),
        access_log=debug,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN + CUT_GRACE,  # HttpServer.stop cuts what is open first
        server_header=False,
        # The speech stream's messages are JSON text pieces (at most 20,000 characters each, http/stream.py);
        # uvicorn's default of 16 MiB per WebSocket message would let one message hold far more memory.
        ws_max_size=WS_MAX_MESSAGE_BYTES,
        **security.uvicorn_ssl_options(),
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn.Server that leaves signal handling to the daemon (its handlers only enqueue)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """The daemon's HTTP server; `url` and `port` are known once `start()` has bound the socket."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        *,
        log_level: str = "INFO",
        security: Security | None = None,
        settings: HttpSettings | None = None,
        max_connections: int = MAX_HTTP_CONNECTIONS,
    ) -> None:
        self.scheme = "https" if security is not None and security.tls else "http"
        self.host = host
        self.requested_port = port
        self.server = _EmbeddedServer(
            uvicorn_config(
                app,
                log_level=log_level,
                security=security,
                settings=settings,
                bind_host=host,
                max_connections=max_connections,
            )
        )
        self.port = 0
        self._socket: socket.socket | None = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def start(self) -> None:
        """Bind (OSError when the address is in use or not available) and serve in a task."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = Listener(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.requested_port))
            sock.listen(2048)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.port = sock.getsockname()[1]
        self._task = asyncio.create_task(self.server.serve(sockets=[sock]), name="http-server")
        while not self.server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # raises what stopped it

    async def stop(self) -> None:
        """Close the listener, let open responses finish (bounded), and end the serving task.

        A response still open after GRACEFUL_SHUTDOWN waits on a client that reads nothing (its request has
        already ended in the pipeline: the drain came first), or one that sends nothing: its connection is cut,
        so the response ends as for a client that went away instead of being cancelled by uvicorn.
        """
        if self._task is None:
            return
        self.server.should_exit = True
        try:
            done, _ = await asyncio.wait({self._task}, timeout=GRACEFUL_SHUTDOWN)
            if not done:
                self._cut_open_connections()
            await self._task
        except (Exception, SystemExit):  # uvicorn exits with SystemExit on startup failures
            log.warning("HTTP server stopped with an error", exc_info=True)
        self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _cut_open_connections(self) -> None:
        connections = list(self.server.server_state.connections)
        if not connections:
            return
        log.warning(
            "%d HTTP connection%s still open %ss after the drain (a client that reads nothing, or sends nothing); "
            "closing them",
            len(connections),
            "" if len(connections) == 1 else "s",
            GRACEFUL_SHUTDOWN,
        )
        for connection in connections:
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()


async def start_http(
    daemon: SpeechDaemon,
    address: str,
    *,
    log_level: str = "INFO",
    extra_routes: Sequence[BaseRoute] = (),
    extra_operations: Sequence[Operation] = (),
    security: Security | None = None,
    settings: SpeechSettings | None = None,
    voice_store: VoiceStore | None = None,
    http_settings: HttpSettings | None = None,
    workers: int = 1,
) -> HttpServer:
    """Serve the daemon's HTTP API on `address` (HOST:PORT); logs the bound URL."""
    from stagevisor.supervisor.http.app import create_app

    parsed = parse_http_address(address)
    assert parsed is not None, "start_http needs an address; --http none means no server"
    host, port = parsed
    budget = fd_budget(nofile_limit(), workers)
    (log.warning if budget.short else log.info)("%s", budget.describe())
    app = create_app(
        daemon,
        settings=settings,
        voice_store=voice_store,
        extra_routes=extra_routes,
        extra_operations=extra_operations,
        authenticated=security is not None and security.authenticated,
    )
    server = HttpServer(
        app,
        host,
        port,
        log_level=log_level,
        security=security,
        settings=http_settings,
        max_connections=budget.http_connections,
    )
    await server.start()
    # Load FFmpeg (PyAV) now, in a thread, rather than in the first mp3 request (a few hundred ms).
    asyncio.get_running_loop().run_in_executor(None, importlib.import_module, "av")
    log.info("HTTP API on %s (POST /v1/audio/speech, playground at /)", server.url)
    return server
