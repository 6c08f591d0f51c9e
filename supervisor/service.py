"""Composition: wire a Daemon to its admin and public gRPC servers, the HTTP API, signals and logging, and run it.

The one module that imports the daemon, the admin API and the data plane's
public services together; none of them imports this one. `stagevisor serve`
calls `run()`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import shutil
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from stagevisor.supervisor import logs
from stagevisor.supervisor.admin import endpoints
from stagevisor.supervisor.admin import servicer as admin
from stagevisor.supervisor._proto import admin_pb2_grpc
from stagevisor.supervisor.addresses import bind_failure, host_port, is_loopback, is_unix, runtime_dir
from stagevisor.supervisor.admin.peer_gate import (
    PeerGate,
    abstract_listener,
    bind_path_listener,
    default_allowed_uids,
)
from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.seams import LauncherFactory
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.runtime_files import make_private_dir, remove_stale_run_dirs
from stagevisor.supervisor.daemon.startup import StartupError, format_startup_failure
from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.synthesis import PUBLIC_SERVER_OPTIONS, add_synthesis_to_server
from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from stagevisor.supervisor.grpc_parsing import add_parsing_service
from stagevisor.supervisor.config.voices import unknown_voice_targets
from stagevisor.supervisor.http.operations import METRICS_OPERATION
from stagevisor.supervisor.metrics.http import MetricsServer, metrics_app, serve_metrics
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.daemon.runtime_files import SocketClaim
from stagevisor.supervisor.security.files import SecurityError
from stagevisor.supervisor.security.server import Security, check_admin_exposure
from stagevisor.supervisor.worker.spec import WorkerSpec

if TYPE_CHECKING:
    from stagevisor.supervisor.http.names import SpeechSettings
    from stagevisor.supervisor.http.settings import HttpSettings

log = logging.getLogger("stagevisor.daemon")


@dataclass
class Servers:
    """The admin and public servers of one daemon, and its claims on their unix socket paths."""

    admin: grpc.aio.Server
    public: grpc.aio.Server
    admin_address: str
    listen: str
    health: endpoints.HealthReporter
    claims: list[SocketClaim] = field(default_factory=list)
    gate: PeerGate | None = None
    """The peer-credential front of a unix admin address (the gRPC admin server listens behind it)."""
    scratch: Path | None = None
    """A private directory made for the admin server's inner socket (no run directory given); removed on stop."""

    async def stop(self, grace: float = 1.0) -> None:
        """Stop both servers, then remove the sockets this daemon created (and nothing else)."""
        try:
            await asyncio.gather(self.admin.stop(grace), self.public.stop(grace))
        finally:
            try:
                if self.gate is not None:
                    await self.gate.stop()
            finally:
                endpoints.release_all(self.claims)
                if self.scratch is not None:
                    shutil.rmtree(self.scratch, ignore_errors=True)


def _schedule(work: Awaitable[None]) -> None:
    """Run `work` on the loop without waiting for it (a serving listener must not block)."""
    asyncio.ensure_future(work)


async def start_servers(
    daemon: Daemon[Gateway],
    *,
    admin_address: str,
    listen: str,
    public_security: Security | None = None,
    admin_security: Security | None = None,
    admin_allowed_uids: frozenset[int] | None = None,
    private_dir: Path | None = None,
    max_public_connections: int | None = None,
) -> Servers:
    """Admin (Admin + health + reflection) and public (Synthesis + health + reflection) servers, started.

    Each unix socket path is claimed first (endpoints.claim_socket): a live daemon
    there or a file that is not a socket is refused, never replaced. The public
    server uses `public_security`; the admin server uses `admin_security` on TCP
    (TLS and token) and only its token on a unix socket. An admin address that
    `check_admin_exposure` refuses is a DaemonError. A unix admin address (path
    or abstract) is a PeerGate letting only `admin_allowed_uids` (default: this
    user and root) through to the gRPC admin server, which listens in
    `private_dir` (the daemon's run directory; a fresh private one when None). The public server accepts at
    most `max_public_connections` connections at once (None: no cap).
    """
    public_security = public_security or Security()
    admin_security = admin_security or Security()
    try:
        check_admin_exposure(admin_address, admin_security)
    except SecurityError as error:
        raise DaemonError(error.message) from None
    gated = is_unix(admin_address)
    if gated:
        admin_security = Security(api_key=admin_security.api_key)  # a private unix socket needs no TLS
    if not is_loopback(listen) and not (public_security.tls and public_security.authenticated):
        log.warning(
            "--listen %s is reachable from other hosts with %s; give --tls-cert/--tls-key and --api-key-file",
            listen,
            public_security.describe(),
        )
    servers: list[grpc.aio.Server] = []
    claims: list[SocketClaim] = []
    bound: list[str] = []
    gate: PeerGate | None = None
    scratch = Path(tempfile.mkdtemp(prefix="sv-admin-")) if gated and private_dir is None else None
    inner_dir = (private_dir or scratch) if gated else None  # where the gated admin server's own socket lives
    try:
        for option, address, security in (
            ("--admin-address", admin_address, admin_security),
            ("--listen", listen, public_security),
        ):
            claim = await endpoints.claim_socket(address, option)
            if claim is not None:
                claims.append(claim)
            if option == "--admin-address" and inner_dir is not None:
                inner = inner_dir / "admin-grpc.sock"
                server, port = endpoints.bind_server(f"unix:{inner}", option, None, security)
                allowed = admin_allowed_uids or default_allowed_uids()
                gate = PeerGate(_gate_listener(address, option, claim, allowed), inner, allowed)
            else:
                cap = (
                    ()
                    if max_public_connections is None
                    else (("grpc.max_allowed_incoming_connections", max_public_connections),)
                )
                server, port = endpoints.bind_server(address, option, claim, security, PUBLIC_SERVER_OPTIONS + cap)
            servers.append(server)
            bound.append(address if is_unix(address) else f"{address.rsplit(':', 1)[0]}:{port}")
        admin_server, public_server = servers
        health = endpoints.HealthReporter()
        add_parsing_service(
            admin_pb2_grpc.add_AdminServicer_to_server,
            admin.AdminServicer(daemon),
            admin_server,
            "proto/stagevisor/v1/admin.proto",
        )
        add_synthesis_to_server(lambda: daemon.gateway, public_server)
        for server, services in (
            (admin_server, (admin.ADMIN_SERVICE,)),
            (public_server, (endpoints.SYNTHESIS_SERVICE,)),
        ):
            health.add_to_server(server)
            reflection.enable_server_reflection(
                (*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server
            )
        await health.set(False)
        daemon.serving_listeners.append(lambda serving: _schedule(health.set(serving)))
        await admin_server.start()
        await public_server.start()
        if gate is not None:
            await gate.start()
    except BaseException:
        await asyncio.gather(*(server.stop(None) for server in servers), return_exceptions=True)
        if gate is not None:
            await gate.stop()
        endpoints.release_all(claims)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    for what, address, security in (
        ("admin API", bound[0], admin_security),
        ("public endpoint", bound[1], public_security),
    ):
        who = (
            f", uids {', '.join(map(str, sorted(gate.allowed_uids)))}"
            if gate is not None and what == "admin API"
            else ""
        )
        log.info("%s listening on %s (%s%s)", what, address, security.describe(), who)
    daemon.public_address = bound[1]
    return Servers(admin_server, public_server, admin_address, listen, health, claims, gate, scratch)


def _gate_listener(address: str, option: str, claim: SocketClaim | None, allowed_uids: frozenset[int]) -> socket.socket:
    """The listening socket of a unix admin address: bound at the claim's staging path and moved into place,
    or in the abstract namespace."""
    try:
        if claim is None:
            return abstract_listener(address)
        listener = bind_path_listener(claim.staging_path, allowed_uids)
    except OSError as error:
        in_use = error.errno == errno.EADDRINUSE
        raise DaemonError(
            f"cannot listen on {address} ({option}): "
            f"{'the name is in use (another daemon?)' if in_use else error.strerror}; choose another {option}",
            code=DaemonErrorCode.ADDRESS_IN_USE if in_use else DaemonErrorCode.DAEMON_ERROR,
        ) from None
    try:
        claim.bound()
    except BaseException:
        listener.close()
        raise
    return listener


async def run(
    plan: Plan,
    options: DaemonOptions,
    *,
    speech: SpeechSettings | None = None,
    http_settings: HttpSettings | None = None,
) -> int:
    """Serve a Plan until SIGTERM/SIGINT or an admin Shutdown; return the exit status.

    With `options.http`, the HTTP API names and shapes speech as `speech` says (--served-model-name,
    --sample-rate, --voices-dir) and its server takes `http_settings` (--http-*); both default to their defaults.
    """
    run_parent = options.run_dir.parent if options.run_dir else runtime_dir()
    make_private_dir(run_parent)
    await endpoints.ensure_no_live_daemon(options.admin_address)
    if options.run_dir is None:  # only our own runtime directory holds d<pid> directories
        for stale in remove_stale_run_dirs(run_parent):
            log.info("removed %s, left by a daemon that is gone", stale)
    daemon = Daemon(plan, options, gateway_factory=Gateway, launcher=launcher_factory(options))
    make_private_dir(daemon.run_dir)  # the admin server's inner socket lives there (admin/peer_gate.py)
    from stagevisor.supervisor.http.connections import fd_budget, nofile_limit

    servers = await start_servers(
        daemon,
        admin_address=options.admin_address,
        listen=options.listen,
        public_security=options.public_security,
        admin_security=options.admin_security,
        admin_allowed_uids=default_allowed_uids(options.admin_allowed_uids),
        private_dir=daemon.run_dir,
        # The half of the spare descriptors the HTTP API does not take (http/connections.py, fd_budget).
        max_public_connections=fd_budget(nofile_limit(), len(plan.workers())).http_connections,
    )
    http = None
    if options.http:
        from stagevisor.supervisor.http.names import SpeechSettings
        from stagevisor.supervisor.http.server import start_http
        from stagevisor.supervisor.http.settings import HttpSettings
        from stagevisor.supervisor.http.voice_store import DirectoryVoiceStore

        speech = speech or SpeechSettings()
        try:
            http = await start_http(
                daemon,
                options.http,
                log_level=options.log_level,
                security=options.public_security,
                http_settings=http_settings or HttpSettings(),
                workers=len(plan.workers()),
                extra_routes=metrics_routes(daemon),
                extra_operations=[METRICS_OPERATION] if daemon.metrics is not None else [],
                settings=speech,
                voice_store=DirectoryVoiceStore(speech.voices_dir) if speech.voices_dir else None,
            )
            daemon.http_url = http.url
            if daemon.metrics is not None and not daemon.monitor.metrics_url:
                daemon.monitor.metrics_url = http.url.rstrip("/") + "/metrics"
        except OSError as error:
            await servers.stop()
            raise listen_error(options.http, "--http", error, "choose another --http, or --http none") from None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.requests.put_nowait, ("signal", signum))
    metrics_server = None
    try:
        metrics_server = await start_metrics(daemon, options)

        async def start_daemon() -> None:
            await daemon.start()
            if http is not None:  # the model's voices are known once its workers said READY
                for problem in unknown_voice_targets(daemon.voices(), daemon.voice_names):
                    log.warning("%s", problem)

        start = asyncio.create_task(start_daemon())
        request = asyncio.create_task(daemon.requests.get())
        await asyncio.wait({start, request}, return_when=asyncio.FIRST_COMPLETED)
        if start.done() and start.exception() is not None:
            request.cancel()
            failure = start.exception()
            assert failure is not None, "checked above"
            if isinstance(failure, StartupError):
                print(format_startup_failure(failure), file=sys.stderr, flush=True)
                return 1
            raise failure
        if not request.done():
            kind, value = await request
        else:
            kind, value = request.result()
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
        grace = value if kind == "shutdown" else None
        log.info("shutting down (%s)", f"signal {signal.Signals(value).name}" if kind == "signal" else "admin request")
        shutdown = asyncio.create_task(daemon.shutdown(grace))
        await _shorten_drain_on_later_stops(daemon, shutdown)
        await shutdown
        return 0
    finally:
        try:
            await daemon.shutdown(0.0)
        finally:
            try:
                if http is not None:  # after the drain: until then new HTTP requests get 503, not a refused connection
                    await http.stop()
            finally:
                try:
                    await servers.stop()
                finally:
                    if metrics_server is not None:
                        await metrics_server.stop()


async def _shorten_drain_on_later_stops(daemon: Daemon[Gateway], shutdown: asyncio.Task[None]) -> None:
    """While `shutdown` runs: a later `stop --grace G` ends its drain within G if that is sooner, and a second
    signal ends it now (an operator's second Ctrl-C); returns when the shutdown is done."""
    while not shutdown.done():
        request = asyncio.create_task(daemon.requests.get())
        await asyncio.wait({shutdown, request}, return_when=asyncio.FIRST_COMPLETED)
        if not request.done():
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            return
        kind, value = request.result()
        grace = value if kind == "shutdown" else 0.0
        log.info(
            "shutting down: %s, the drain ends within %s",
            f"signal {signal.Signals(value).name} again" if kind == "signal" else "another admin request",
            "the daemon's drain timeout" if grace is None else f"{grace:g} s",
        )
        daemon.shorten_drain(grace)


def launcher_factory(options: DaemonOptions) -> LauncherFactory[Gateway] | None:
    """The launcher `--launcher` names: None for local (the daemon's default), the Ray launcher's factory for ray."""
    if options.launcher != "ray":
        return None

    def ray(plan: Plan, specs: Mapping[str, WorkerSpec], gateway: Gateway, options: DaemonOptions) -> DaemonLauncher:
        from stagevisor.supervisor.cluster.launcher import RayLauncher

        return RayLauncher(
            plan,
            options.ray_address,
            heartbeat_timeout=options.heartbeat_timeout,
            gateway=gateway,
            tls=options.public_security.tls,
        )

    return ray


def metrics_routes(daemon: Daemon[Gateway]) -> list:
    """/metrics on the HTTP API (the same registry as --metrics), or nothing with --no-metrics."""
    if daemon.metrics is None:
        return []
    from starlette.routing import Route

    app = metrics_app(daemon.metrics.registry)

    class Endpoint:  # an instance, so starlette hands it the raw ASGI call (a function would get a Request)
        async def __call__(self, scope, receive, send):
            await app(scope, receive, send)

    return [Route("/metrics", Endpoint(), methods=["GET"])]


METRICS_MAX_CONNECTIONS = 16
"""Open connections to the standalone /metrics server: a scraper or two needs a few; the rest are idle or hostile."""


def metrics_protocol() -> Any:
    """The standalone /metrics server's connections: the HTTP API's read deadlines and a small cap, so clients
    that connect and send nothing cannot take the daemon's descriptors (workers, gRPC and HTTP share them)."""
    from stagevisor.supervisor.http.connections import guarded_protocol
    from stagevisor.supervisor.http.settings import ConnectionLimits

    return guarded_protocol(ConnectionLimits(), METRICS_MAX_CONNECTIONS)


def metrics_guard(address: str) -> Callable[[Any], Any]:
    """The standalone /metrics server's request checks, as the HTTP API's: an absolute-form target read as its path
    and authority (`GET http://HOST:PORT/metrics`, which a server must accept), then, on a loopback address, the
    Host check that answers loopback names only (a page whose name was rebound to 127.0.0.1 cannot read it)."""
    from stagevisor.supervisor.http.origins import HostGuard
    from stagevisor.supervisor.http.settings import default_allowed_hosts
    from stagevisor.supervisor.http.targets import AbsoluteTarget

    parsed = host_port(address)
    hosts = default_allowed_hosts(parsed[0]) if parsed is not None else ["*"]
    methods = "GET, HEAD, OPTIONS"  # what the port serves (metrics/http.py's only_metrics), and `OPTIONS *`
    if hosts == ["*"]:
        return lambda app: AbsoluteTarget(app, methods)
    return lambda app: AbsoluteTarget(HostGuard(app, hosts), methods)


async def start_metrics(daemon: Daemon[Gateway], options: DaemonOptions) -> MetricsServer | None:
    """The standalone /metrics endpoint of --metrics HOST:PORT, or None."""
    if not options.metrics_address or daemon.metrics is None:
        return None
    try:
        server = await serve_metrics(
            daemon.metrics.registry, options.metrics_address, metrics_protocol(), metrics_guard(options.metrics_address)
        )
    except OSError as error:
        raise listen_error(options.metrics_address, "--metrics", error, "choose another --metrics HOST:PORT") from None
    except ValueError as error:
        raise DaemonError(
            f"cannot serve metrics on {options.metrics_address} (--metrics): {error}; "
            "choose another --metrics HOST:PORT"
        ) from error
    daemon.monitor.metrics_url = server.url
    return server


def listen_error(address: str, option: str, error: OSError, remedy: str) -> DaemonError:
    """The DaemonError of a server that could not bind `address` (HOST:PORT) for `option`: ADDRESS_IN_USE for a
    port in use, worded as --listen's, else DAEMON_ERROR naming the reason."""
    return DaemonError(
        f"cannot listen on {address} ({option}): {bind_failure(address, error)}; {remedy}",
        code=DaemonErrorCode.ADDRESS_IN_USE if error.errno == errno.EADDRINUSE else DaemonErrorCode.DAEMON_ERROR,
    )


def configure_logging(level: str) -> None:
    logs.configure(level, "daemon pid %(process)d")
