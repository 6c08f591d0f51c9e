"""The admin API: the stagevisor.v1.Admin servicer, gRPC health, server creation and the admin socket.

The servicer reads a daemon through a small interface (`AdminDaemon`), so
unit tests drive it with a fake; supervisor/service.py wires it to the
real Daemon. Topology, status and the metrics summary travel as the typed
reports of supervisor/reports/, which own their proto conversion.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, AsyncIterator, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
from stagevisor.supervisor.addresses import unix_path
from stagevisor.supervisor.errors import (
    DaemonError,
    DaemonErrorCode,
    StagevisorError,
    WorkerStartError,
    shown,
)
from stagevisor.supervisor.placement.diff import TopologyDiff
from stagevisor.supervisor.placement.request import PlacementRequest
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import StatusReport, SummaryReport, TopologyReport
from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent
from stagevisor.supervisor.daemon.runtime_files import SocketClaim
from stagevisor.supervisor.security import Security

log = logging.getLogger("stagevisor.admin")

SYNTHESIS_SERVICE = "stagevisor.v1.Synthesis"
HEALTH_SERVICES = ("", SYNTHESIS_SERVICE)
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
LIVE_CHECK_TIMEOUT = 1.0
HISTORY_HEADER = "stagevisor-history"
"""WatchEvents request metadata: "1" asks for the daemon's recent lifecycle events before the live ones."""
REPLAYED_HEADER = "stagevisor-replayed"
"""WatchEvents response header: how many of the first events are recent history, not new."""


# -- the servicer ------------------------------------------------------------

REFUSALS = (StagevisorError, DaemonError)
"""What a scale, an apply or a restart is refused with: FAILED_PRECONDITION, the operator's message
(`refusal`). A worker that fails to start is INTERNAL instead, said per RPC."""


def refusal(error: StagevisorError | DaemonError) -> str:
    """The FAILED_PRECONDITION message of a refused scale, apply or restart: a StagevisorError (a PlacementError, a
    ConfigError) with its code first, which the CLI reads back; a DaemonError (the daemon is not serving) as is."""
    return f"{error.code.value}: {error.message}" if isinstance(error, StagevisorError) else str(error)


class AdminDaemon(Protocol):
    """What the admin servicer needs from the daemon (supervisor/daemon/core.py's Daemon)."""

    def topology(self) -> TopologyReport: ...

    def status(self) -> StatusReport: ...

    def metrics_summary(self) -> SummaryReport:
        """What `stagevisor top` shows: per group resources and in flight, per stage recent latency."""

    def group_names(self) -> list[str]: ...

    def group_state(self, name: str) -> GroupState:
        """The group's state; KeyError for an unknown group."""

    async def restart_group(self, name: str, *, force: bool = False) -> tuple[int, int]: ...

    async def scale_group(self, name: str, replicas: int) -> tuple[int, int, list[str]]:
        """Run `replicas` workers of a group; PlacementError when refused, KeyError for an unknown group."""

    async def apply_request(self, request: PlacementRequest, *, dry_run: bool = False) -> tuple[Plan, TopologyDiff]:
        """Plan `request` with the `plan` rules and move to that plan live (or only compare, with dry_run): the plan
        and the difference; StagevisorError or DaemonError when refused (nothing changed; counted as such)."""

    def request_shutdown(self, grace: float | None = None) -> float: ...

    def subscribe(self, history: bool = False) -> asyncio.Queue[LifecycleEvent | None]:
        """Events from now on (with `history`, the recent ones first); None marks the end of the stream."""

    def unsubscribe(self, queue: asyncio.Queue[LifecycleEvent | None]) -> None: ...


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """stagevisor.v1.Admin over a daemon; errors are `context.abort(code, operator message)`."""

    def __init__(self, daemon: AdminDaemon) -> None:
        self.daemon = daemon

    async def GetTopology(
        self, request: admin_pb2.GetTopologyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Topology:
        return self.daemon.topology().to_proto()

    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Status:
        return self.daemon.status().to_proto()

    async def RestartGroup(
        self, request: admin_pb2.RestartGroupRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RestartGroupResponse:
        names = self.daemon.group_names()
        if request.name not in names:
            known = ", ".join(names)
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no process group {shown(request.name)}; known groups: {known}"
            )
        try:
            old_pid, new_pid = await self.daemon.restart_group(request.name, force=request.force)
        except KeyError:  # a scale or an apply that ran first removed the replica
            known = ", ".join(self.daemon.group_names())
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"process group {shown(request.name)} was removed by a scale or an apply while the restart waited "
                f"for it; known groups: {known}",
            )
        except REFUSALS as error:  # not serving, or its GPU cannot hold a second worker beside it
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        except WorkerStartError as error:
            where = f" (stage {error.stage!r})" if error.stage else ""
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"group {request.name!r} failed to restart{where}: {error.message}; {error.advice}",
            )
        try:
            state = self.daemon.group_state(request.name).value
        except KeyError:  # an apply switched topology meanwhile: the worker restarted here was retired with the rest
            state = GroupState.STOPPED.value
        return admin_pb2.RestartGroupResponse(name=request.name, old_pid=old_pid, new_pid=new_pid, state=state)

    async def ScaleGroup(
        self, request: admin_pb2.ScaleGroupRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ScaleGroupResponse:
        try:
            old, new, workers = await self.daemon.scale_group(request.name, request.replicas)
        except REFUSALS as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        except WorkerStartError as error:
            where = f" (stage {error.stage!r})" if error.stage else ""
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"a new replica of group {request.name!r} failed to start{where}: {error.message}; "
                "the group keeps its replicas, see `stagevisor status`",
            )
        return admin_pb2.ScaleGroupResponse(name=request.name, old_replicas=old, new_replicas=new, workers=workers)

    async def Apply(
        self, request: admin_pb2.ApplyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApplyResponse:
        if request.HasField("config_path") and not request.HasField("config_text"):
            # The daemon does not read a config file a client names: it may read what the client cannot, and a parse
            # error would quote it back.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Apply takes the config's YAML in config_text; config_path only names it in messages (the daemon "
                "reads no config file a client names): `stagevisor apply --config FILE` sends the file's text",
            )
        placement = PlacementRequest(
            model_path=request.model_path if request.HasField("model_path") else None,
            config_path=request.config_path if request.HasField("config_path") else None,
            config_text=request.config_text if request.HasField("config_text") else None,
            isolate_stages=tuple(request.isolate_stages),
            stage_processes=tuple(request.stage_processes),
            process_replicas=tuple(request.process_replicas),
        )
        try:
            plan, diff = await self.daemon.apply_request(placement, dry_run=request.dry_run)
        except REFUSALS as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        return admin_pb2.ApplyResponse(
            changed=diff.changed,
            applied=diff.changed and not request.dry_run,
            diff_json=json.dumps(diff.to_json()),
            plan_json=json.dumps(plan.to_json()),
        )

    async def Shutdown(
        self, request: admin_pb2.ShutdownRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ShutdownResponse:
        grace = request.grace_seconds if request.HasField("grace_seconds") else None
        if grace is not None and grace < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grace must be >= 0 seconds, got {grace:g}")
        return admin_pb2.ShutdownResponse(deadline_seconds=self.daemon.request_shutdown(grace))

    async def GetMetricsSummary(
        self, request: admin_pb2.GetMetricsSummaryRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.MetricsSummary:
        return self.daemon.metrics_summary().to_proto()

    async def WatchEvents(
        self, request: admin_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.LifecycleEvent]:
        # A client that asks (metadata `stagevisor-history: 1`) gets the recent events first; the
        # header `stagevisor-replayed` says how many of the first events are such history.
        history = dict(context.invocation_metadata() or ()).get(HISTORY_HEADER) == "1"
        queue = self.daemon.subscribe(history)
        # Also when the call ends, not only in this generator's `finally`: a watcher that stopped reading and then
        # went away leaves the generator suspended at a write until the garbage collector finalizes it.
        context.add_done_callback(lambda _: self.daemon.unsubscribe(queue))
        replayed = queue.qsize() if history else 0  # (one more than sent when the daemon already stopped: harmless)
        try:
            # Headers go out once subscribed: a client that waits for them misses no event after.
            await context.send_initial_metadata(((REPLAYED_HEADER, str(replayed)),))
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield admin_pb2.LifecycleEvent(
                    group=event.group,
                    old_state=event.old_state.value,
                    new_state=event.new_state.value,
                    pid=event.pid,
                    reason=event.reason,
                    time=event.time,
                    kind=event.kind,
                )
        finally:
            self.daemon.unsubscribe(queue)


# -- servers -----------------------------------------------------------------


SERVER_OPTIONS = (("grpc.so_reuseport", 0),)
"""gRPC sets SO_REUSEPORT by default: a second daemon on the same port would start silently and take a
share of the traffic. Off, binding a port in use fails, and the daemon says so."""


def create_server(
    address: str, security: Security | None = None, options: tuple[tuple[str, Any], ...] = ()
) -> tuple[grpc.aio.Server, int]:
    """An aio server bound to `address` (host:port or unix:PATH); the port is 0 for unix sockets.

    A unix socket's directory is created private (0700) when missing. An
    address that cannot be bound (a port in use) raises OSError saying why. With
    `security`, the server serves TLS and checks the bearer token it carries.
    """
    security = security or Security()
    path = unix_path(address)
    if path is not None and not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    server = grpc.aio.server(options=SERVER_OPTIONS + tuple(options), interceptors=security.grpc_interceptors())
    credentials = security.grpc_server_credentials()
    try:
        port = (
            server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
        )
    except RuntimeError:  # grpc raises RuntimeError("Failed to bind ...") when it cannot bind
        port = None
    if port is None or (port == 0 and path is None):
        raise OSError(bind_problem(address) if path is None else f"cannot bind a unix socket at {path}")
    return server, port


def bind_problem(address: str) -> str:
    """Why `address` (host:port) cannot be bound, in words, found by binding it with a plain socket."""
    import errno
    import socket

    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError):
        return f"{address} is not a valid host:port address"
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(sockaddr)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return f"port {port} on {host} is already in use (another stagevisor daemon or another program)"
                if error.errno == errno.EACCES:
                    return f"permission denied for port {port} (ports below 1024 need privileges)"
                if error.errno == errno.EADDRNOTAVAIL:
                    return f"{host} is not an address of this host"
                return f"cannot bind {address}: {error.strerror}"
    return f"cannot bind {address}"


class HealthReporter:
    """One grpc.health.v1 servicer per server; SERVING only while every group is READY."""

    def __init__(self) -> None:
        self.servicers: list[HealthServicer] = []

    def add_to_server(self, server: grpc.aio.Server) -> None:
        servicer = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        self.servicers.append(servicer)

    async def set(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for servicer in self.servicers:
            for service in HEALTH_SERVICES:
                await servicer.set(service, status)


def release_all(claims: list[SocketClaim]) -> None:
    for claim in claims:
        try:
            claim.release()
        except OSError as error:
            log.warning("could not release %s: %s", claim.path, error)


async def claim_socket(address: str, option: str, *, remove_stale: bool = True) -> SocketClaim | None:
    """Lock a unix socket path for this daemon and clear a stale socket there; None for TCP addresses.

    Raises DaemonError: DAEMON_RUNNING when a live daemon holds or answers at
    the path, UNSAFE_PATH when something other than a socket is there.
    """
    path = unix_path(address)
    if path is None:
        return None
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    claim = SocketClaim.acquire(path, option)
    try:
        claim.refuse_non_socket()
        # A daemon of a version without the lock file: its socket still answers.
        if claim.existing() == "socket" and await daemon_answers(address):
            raise DaemonError(
                f"a stagevisor daemon already answers at {address} ({option}); "
                f"stop it with `stagevisor stop` or choose another {option}",
                code=DaemonErrorCode.DAEMON_RUNNING,
            )
        if remove_stale:
            claim.remove_stale_socket()
    except BaseException:
        claim.release()
        raise
    return claim


def bind_server(
    address: str,
    option: str,
    claim: SocketClaim | None,
    security: Security | None = None,
    options: tuple[tuple[str, Any], ...] = (),
) -> tuple[grpc.aio.Server, int]:
    """create_server() for `option`; a unix socket binds at the claim's staging path and is moved into place.

    Returns (server, port; 0 for a unix socket). Raises DaemonError naming the
    address: ADDRESS_IN_USE for a port in use.
    """
    try:
        server, port = create_server(address if claim is None else f"unix:{claim.staging_path}", security, options)
    except OSError as error:
        code = DaemonErrorCode.ADDRESS_IN_USE if "in use" in str(error) else DaemonErrorCode.DAEMON_ERROR
        raise DaemonError(
            f"cannot listen on {address} ({option}): {error}; choose another {option}", code=code
        ) from None
    if claim is not None:
        claim.bound()  # grpc binds in add_insecure_port: the socket exists, move it into place
    return server, port


async def daemon_answers(address: str, timeout: float = LIVE_CHECK_TIMEOUT) -> bool:
    """True when a gRPC health service answers at `address` within `timeout` seconds."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=False
            )
            return True
        except grpc.aio.AioRpcError:
            return False


async def ensure_no_live_daemon(admin_address: str) -> None:
    """Refuse to start over a live daemon or over a file that is not a socket; removes nothing.

    A unix admin socket is checked under its lock (a daemon holding the lock is
    live, however slowly it answers); a TCP address by asking it. The socket a
    dead daemon left is removed when the servers start, under the lock.
    """
    if unix_path(admin_address) is None:
        if await daemon_answers(admin_address):
            raise DaemonError(
                f"a stagevisor daemon already answers at {admin_address}; "
                "stop it with `stagevisor stop` or choose another --admin-address",
                code=DaemonErrorCode.DAEMON_RUNNING,
            )
        return
    claim = await claim_socket(admin_address, "--admin-address", remove_stale=False)
    if claim is not None:
        claim.release()
