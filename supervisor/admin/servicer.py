"""The admin API: the stagevisor.v1.Admin servicer, gRPC health, server creation and the admin socket.

The servicer reads a daemon through a small interface (`AdminDaemon`), so
unit tests drive it with a fake; supervisor/service.py wires it to the
real Daemon. The JSON <-> proto converters here are what
the CLI uses too, so `stagevisor topology --format json` has exactly the
shape of `stagevisor plan --format json` plus the runtime fields.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, AsyncIterator, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
from stagevisor.supervisor.addresses import is_loopback  # noqa: F401 - re-exported for callers of admin.is_loopback
from stagevisor.supervisor.errors import (
    DaemonError,
    DaemonErrorCode,
    PlacementError,
    StagevisorError,
    WorkerStartError,
    shown,
)
from stagevisor.supervisor.placement.diff import TopologyDiff
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.daemon.lifecycle import LifecycleEvent
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


# -- JSON <-> proto ----------------------------------------------------------


def _opt(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _set_opt(kwargs: dict[str, Any], field: str, value: Any) -> None:
    if value is not None:
        kwargs[field] = value


def resources_to_proto(res: dict[str, Any] | None) -> admin_pb2.GroupResources | None:
    """A group's measured resources (supervisor/metrics/resources.py GroupUsage JSON) as a message."""
    if not res:
        return None
    kwargs = {
        k: res[k]
        for k in ("rss_bytes", "cpu_seconds", "cpu_percent", "threads", "open_fds", "budget_kind", "over_budget")
    }
    for field in ("gpu_memory_bytes", "memory_budget_bytes"):
        _set_opt(kwargs, field, res.get(field))
    return admin_pb2.GroupResources(**kwargs)


def resources_from_proto(message: Any) -> dict[str, Any] | None:
    if not message.HasField("resources"):
        return None
    r = message.resources
    return {
        "rss_bytes": r.rss_bytes,
        "cpu_seconds": r.cpu_seconds,
        "cpu_percent": r.cpu_percent,
        "threads": r.threads,
        "open_fds": r.open_fds,
        "gpu_memory_bytes": _opt(r, "gpu_memory_bytes"),
        "memory_budget_bytes": _opt(r, "memory_budget_bytes"),
        "budget_kind": r.budget_kind,
        "over_budget": r.over_budget,
    }


def topology_to_proto(data: dict[str, Any]) -> admin_pb2.Topology:
    """Daemon.topology() (the plan JSON plus runtime fields) as a Topology message."""
    groups = []
    for g in data["groups"]:
        kwargs = dict(
            name=g["name"],
            stages=g["stages"],
            pid=g.get("pid") or 0,
            state=g.get("state", ""),
            restarts=g.get("restarts", 0),
            fraction_enforced=bool(g.get("fraction_enforced")),
            device=g.get("device", ""),
            host=g.get("host") or "",
            node_id=g.get("node_id") or "",
        )
        for field in ("gpu", "total_gpu_memory_fraction", "tp_rank", "started_at", "physical_gpu", "node"):
            _set_opt(kwargs, field, g.get(field))
        _set_opt(kwargs, "resources", resources_to_proto(g.get("resources")))
        if g.get("replicas", 1) > 1:
            kwargs["replicas"] = g["replicas"]
            kwargs["workers"] = [_replica_to_proto(w) for w in g.get("workers", [])]
        if g.get("autoscale") is not None:
            kwargs["autoscale"] = admin_pb2.AutoscaleBounds(
                **{k: v for k, v in g["autoscale"].items() if v is not None}
            )
        groups.append(admin_pb2.ProcessGroup(**kwargs))
    stages = []
    for s in data["stages"]:
        gpu = s["gpu"]
        kwargs = dict(
            name=s["name"],
            process=s["process"],
            tp_size=s["tp_size"],
            gpu=[] if gpu is None else (gpu if isinstance(gpu, list) else [gpu]),
            stand_in=bool(s.get("stand_in", False)),
        )
        for field in ("total_gpu_memory_fraction", "fraction_source"):
            _set_opt(kwargs, field, s.get(field))
        stages.append(admin_pb2.Stage(**kwargs))
    edges = [
        admin_pb2.Edge(
            src=e["src"],
            dst=e["dst"],
            kind=e["kind"],
            cross_process=e["cross_process"],
            process_safe=e["process_safe"],
            transport=e.get("transport", ""),
            src_group=e.get("src_group", ""),
            dst_group=e.get("dst_group", ""),
            requests=e.get("requests", {}),
        )
        for e in data["edges"]
    ]
    gpus = []
    for b in data["gpus"]:
        kwargs = dict(
            id=b["id"],
            total_gpu_memory_fraction=b["total_gpu_memory_fraction"],
            limit=b["limit"],
            groups=b["groups"],
            over_limit=bool(b.get("over_limit")),
        )
        for field in ("total_bytes", "measured_bytes"):
            _set_opt(kwargs, field, b.get(field))
        gpus.append(admin_pb2.GpuBudget(**kwargs))
    kwargs = dict(
        changed=data["changed"], groups=groups, stages=stages, edges=edges, gpus=gpus, warnings=data["warnings"]
    )
    _set_opt(kwargs, "model", data.get("model"))
    _set_opt(kwargs, "model_path", data.get("model_path"))
    return admin_pb2.Topology(**kwargs)


def _replica_to_proto(w: dict[str, Any]) -> admin_pb2.ReplicaWorker:
    kwargs = dict(
        name=w["name"],
        replica=w["replica"],
        pid=w.get("pid") or 0,
        state=w.get("state", ""),
        restarts=w.get("restarts", 0),
        device=w.get("device", ""),
        host=w.get("host") or "",
        node_id=w.get("node_id") or "",
    )
    for field in ("gpu", "started_at", "physical_gpu", "node"):
        _set_opt(kwargs, field, w.get(field))
    _set_opt(kwargs, "resources", resources_to_proto(w.get("resources")))
    return admin_pb2.ReplicaWorker(**kwargs)


def _replica_from_proto(w: admin_pb2.ReplicaWorker) -> dict[str, Any]:
    return {
        "name": w.name,
        "replica": w.replica,
        "gpu": _opt(w, "gpu"),
        "pid": w.pid,
        "state": w.state,
        "restarts": w.restarts,
        "started_at": _opt(w, "started_at"),
        "physical_gpu": _opt(w, "physical_gpu"),
        "device": w.device,
        "resources": resources_from_proto(w),
        "host": w.host,
        "node_id": w.node_id,
        **({"node": w.node} if w.HasField("node") else {}),
    }


def _group_from_proto(g: admin_pb2.ProcessGroup) -> dict[str, Any]:
    group = {
        "name": g.name,
        "stages": list(g.stages),
        "gpu": _opt(g, "gpu"),
        "total_gpu_memory_fraction": _opt(g, "total_gpu_memory_fraction"),
        "tp_rank": _opt(g, "tp_rank"),
    }
    if g.replicas > 1:  # the plan's keys, in its order; a single worker keeps the object it always had
        workers = [_replica_from_proto(w) for w in g.workers]
        group.update(replicas=g.replicas, replica_gpus=[w["gpu"] for w in workers])
    if g.HasField("node"):
        group["node"] = g.node
    if g.HasField("autoscale"):
        bounds = g.autoscale
        group["autoscale"] = {
            field.name: (
                _opt(bounds, field.name) if field.name == "target_stall_p90_seconds" else getattr(bounds, field.name)
            )
            for field in bounds.DESCRIPTOR.fields
        }
    group.update(
        {
            "pid": g.pid,
            "state": g.state,
            "restarts": g.restarts,
            "started_at": _opt(g, "started_at"),
            "fraction_enforced": g.fraction_enforced,
            "physical_gpu": _opt(g, "physical_gpu"),
            "device": g.device,
            "resources": resources_from_proto(g),
            "host": g.host,
            "node_id": g.node_id,
        }
    )
    if g.replicas > 1:
        group["pid"] = g.pid or None
        group["workers"] = workers
    return group


def topology_from_proto(msg: admin_pb2.Topology) -> dict[str, Any]:
    """A Topology message back to the JSON shape of `stagevisor plan --format json` plus runtime fields."""
    groups = [_group_from_proto(g) for g in msg.groups]
    stages = [
        {
            "name": s.name,
            "process": s.process,
            "gpu": list(s.gpu) if s.tp_size > 1 else (s.gpu[0] if s.gpu else None),
            "tp_size": s.tp_size,
            "total_gpu_memory_fraction": _opt(s, "total_gpu_memory_fraction"),
            "fraction_source": _opt(s, "fraction_source"),
            "stand_in": s.stand_in,
        }
        for s in msg.stages
    ]
    edges = [
        {
            "src": e.src,
            "dst": e.dst,
            "kind": e.kind,
            "cross_process": e.cross_process,
            "process_safe": e.process_safe,
            "transport": e.transport,
            "src_group": e.src_group,
            "dst_group": e.dst_group,
            "requests": dict(e.requests),
        }
        for e in msg.edges
    ]
    gpus = [
        {
            "id": b.id,
            "total_gpu_memory_fraction": b.total_gpu_memory_fraction,
            "limit": b.limit,
            "groups": list(b.groups),
            "total_bytes": _opt(b, "total_bytes"),
            "measured_bytes": _opt(b, "measured_bytes"),
            "over_limit": b.over_limit,
        }
        for b in msg.gpus
    ]
    return {
        "model": _opt(msg, "model"),
        "model_path": _opt(msg, "model_path"),
        "changed": msg.changed,
        "groups": groups,
        "stages": stages,
        "edges": edges,
        "gpus": gpus,
        "warnings": list(msg.warnings),
    }


def status_to_proto(data: dict[str, Any]) -> admin_pb2.Status:
    groups = []
    for g in data["groups"]:
        kwargs = {k: g[k] for k in ("name", "state", "pid", "restarts")}
        kwargs.update(host=g.get("host") or "", node_id=g.get("node_id") or "")
        _set_opt(kwargs, "resources", resources_to_proto(g.get("resources")))
        groups.append(admin_pb2.GroupStatus(**kwargs))
    kwargs = dict(
        state=data["state"],
        pid=data["pid"],
        uptime_seconds=data["uptime_seconds"],
        groups_ready=data["groups_ready"],
        groups_total=data["groups_total"],
        in_flight=data["in_flight"],
        groups=groups,
        warnings=data.get("warnings", []),
        metrics_url=data.get("metrics_url", ""),
        missing_replicas=data.get("missing_replicas", []),
    )
    if data.get("root_cause"):
        kwargs["root_cause"] = admin_pb2.RootCause(**data["root_cause"])
    return admin_pb2.Status(**kwargs)


def status_from_proto(msg: admin_pb2.Status) -> dict[str, Any]:
    root = msg.root_cause if msg.HasField("root_cause") else None
    return {
        "state": msg.state,
        "pid": msg.pid,
        "uptime_seconds": msg.uptime_seconds,
        "groups_ready": msg.groups_ready,
        "groups_total": msg.groups_total,
        "in_flight": msg.in_flight,
        "root_cause": None
        if root is None
        else {
            "group": root.group,
            "stage": root.stage,
            "message": root.message,
            "traceback": root.traceback,
            "time": root.time,
        },
        "groups": [
            {
                "name": g.name,
                "state": g.state,
                "pid": g.pid,
                "restarts": g.restarts,
                "resources": resources_from_proto(g),
                "host": g.host,
                "node_id": g.node_id,
            }
            for g in msg.groups
        ],
        "warnings": list(msg.warnings),
        "metrics_url": msg.metrics_url,
        **({"missing_replicas": list(msg.missing_replicas)} if msg.missing_replicas else {}),
    }


def summary_to_proto(data: dict[str, Any]) -> admin_pb2.MetricsSummary:
    groups = []
    for g in data["groups"]:
        kwargs = {k: g[k] for k in ("name", "state", "pid", "restarts", "in_flight")}
        _set_opt(kwargs, "resources", resources_to_proto(g.get("resources")))
        groups.append(admin_pb2.GroupSummary(**kwargs))
    stages = []
    for s in data["stages"]:
        kwargs = {k: s[k] for k in ("name", "group", "in_flight", "count")}
        for field in ("p50_seconds", "p99_seconds"):
            _set_opt(kwargs, field, s.get(field))
        stages.append(admin_pb2.StageSummary(**kwargs))
    return admin_pb2.MetricsSummary(
        state=data["state"],
        window_seconds=data["window_seconds"],
        in_flight=data["in_flight"],
        groups=groups,
        stages=stages,
        warnings=data["warnings"],
    )


def summary_from_proto(msg: admin_pb2.MetricsSummary) -> dict[str, Any]:
    return {
        "state": msg.state,
        "window_seconds": msg.window_seconds,
        "in_flight": msg.in_flight,
        "groups": [
            {
                "name": g.name,
                "state": g.state,
                "pid": g.pid,
                "restarts": g.restarts,
                "in_flight": g.in_flight,
                "resources": resources_from_proto(g),
            }
            for g in msg.groups
        ],
        "stages": [
            {
                "name": s.name,
                "group": s.group,
                "in_flight": s.in_flight,
                "count": s.count,
                "p50_seconds": _opt(s, "p50_seconds"),
                "p99_seconds": _opt(s, "p99_seconds"),
            }
            for s in msg.stages
        ],
        "warnings": list(msg.warnings),
    }


# -- the servicer ------------------------------------------------------------


class AdminDaemon(Protocol):
    """What the admin servicer needs from the daemon (supervisor/daemon/core.py's Daemon)."""

    def topology(self) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def metrics_summary(self) -> dict[str, Any]:
        """What `stagevisor top` shows: per group resources and in flight, per stage recent latency."""

    def group_names(self) -> list[str]: ...

    def group_state(self, name: str) -> Any:
        """The group's state (an enum with a string `value`); KeyError for an unknown group."""

    async def restart_group(self, name: str) -> tuple[int, int]: ...

    async def scale_group(self, name: str, replicas: int) -> tuple[int, int, list[str]]:
        """Run `replicas` workers of a group; PlacementError when refused, KeyError for an unknown group."""

    async def apply_plan(self, plan: Plan, *, dry_run: bool = False) -> TopologyDiff:
        """Move to `plan` live (or only compare, with dry_run); StagevisorError or DaemonError when refused."""

    def request_shutdown(self, grace: float | None = None) -> float: ...

    def subscribe(self, history: bool = False) -> asyncio.Queue[LifecycleEvent]: ...

    def unsubscribe(self, queue: asyncio.Queue[LifecycleEvent]) -> None: ...


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """stagevisor.v1.Admin over a daemon; errors are `context.abort(code, operator message)`."""

    def __init__(self, daemon: AdminDaemon) -> None:
        self.daemon = daemon

    async def GetTopology(
        self, request: admin_pb2.GetTopologyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Topology:
        return topology_to_proto(self.daemon.topology())

    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Status:
        return status_to_proto(self.daemon.status())

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
            old_pid, new_pid = await self.daemon.restart_group(request.name)
        except DaemonError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except WorkerStartError as error:
            where = f" (stage {error.stage!r})" if error.stage else ""
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"group {request.name!r} failed to restart{where}: {error.message}; "
                "it is retried with backoff, see `stagevisor status`",
            )
        state = self.daemon.group_state(request.name).value
        return admin_pb2.RestartGroupResponse(name=request.name, old_pid=old_pid, new_pid=new_pid, state=state)

    async def ScaleGroup(
        self, request: admin_pb2.ScaleGroupRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ScaleGroupResponse:
        try:
            old, new, workers = await self.daemon.scale_group(request.name, request.replicas)
        except PlacementError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.code.value}: {error.message}")
        except DaemonError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
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
        placement = PlacementRequest(
            model_path=request.model_path if request.HasField("model_path") else None,
            config_path=request.config_path if request.HasField("config_path") else None,
            config_text=request.config_text if request.HasField("config_text") else None,
            isolate_stages=tuple(request.isolate_stages),
            stage_processes=tuple(request.stage_processes),
            process_replicas=tuple(request.process_replicas),
        )
        try:
            plan = plan_placement(placement)
            diff = await self.daemon.apply_plan(plan, dry_run=request.dry_run)
        except StagevisorError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{error.code.value}: {error.message}")
        except DaemonError as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
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
        return summary_to_proto(self.daemon.metrics_summary())

    async def WatchEvents(
        self, request: admin_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.LifecycleEvent]:
        # A client that asks (metadata `stagevisor-history: 1`) gets the recent events first; the
        # header `stagevisor-replayed` says how many of the first events are such history.
        history = dict(context.invocation_metadata() or ()).get(HISTORY_HEADER) == "1"
        queue = self.daemon.subscribe(history)
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
                    kind=getattr(event, "kind", ""),
                )
        finally:
            self.daemon.unsubscribe(queue)


# -- servers -----------------------------------------------------------------


def unix_path(address: str) -> Path | None:
    if address.startswith("unix://"):
        return Path(address[len("unix://") :])
    if address.startswith("unix:"):
        return Path(address[len("unix:") :])
    return None


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
