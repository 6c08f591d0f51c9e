"""The daemon's reports (topology, status, metrics summary): one typed form, with its protobuf message and its JSON.

The daemon builds these; the admin servicer sends them with `to_proto`; the
CLI reads them back with `from_proto` and prints `to_json` (`--format json`)
or its text; the HTTP API serves `to_json`. Each class has exactly one
conversion each way: `to_proto`/`from_proto` (stagevisor.v1 admin messages)
and `to_json`/`from_json` (the JSON the CLI prints, which is
`stagevisor plan --format json` plus runtime fields for the topology).
Optional proto fields are None here and null in JSON; keys that JSON shows
only sometimes (`replicas`, `node`, `workers`, `missing_replicas`, ...) are
shown exactly when the proto side would carry them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.plan import Autoscale

JsonObject = dict[str, Any]


# -- shared ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupResources:
    """What the daemon measured of one worker (psutil, NVML) and its memory budget."""

    rss_bytes: int
    cpu_seconds: float
    """Over every worker of the group, restarts included."""
    cpu_percent: float
    """Of one core, since the previous sample."""
    threads: int
    open_fds: int
    gpu_memory_bytes: int | None = None
    """None: not measurable here (no NVML, or a CPU group)."""
    memory_budget_bytes: int | None = None
    """None: no budget."""
    budget_kind: str = ""
    """"gpu_fraction" (fraction x GPU memory), "rss" (--rss-budget) or ""."""
    over_budget: bool = False

    def to_json(self) -> JsonObject:
        return {
            "rss_bytes": self.rss_bytes,
            "cpu_seconds": self.cpu_seconds,
            "cpu_percent": self.cpu_percent,
            "threads": self.threads,
            "open_fds": self.open_fds,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "memory_budget_bytes": self.memory_budget_bytes,
            "budget_kind": self.budget_kind,
            "over_budget": self.over_budget,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupResources:
        return cls(**data)

    def to_proto(self) -> admin_pb2.GroupResources:
        return admin_pb2.GroupResources(**self.to_json())

    @classmethod
    def from_proto(cls, message: admin_pb2.GroupResources) -> GroupResources:
        return cls(
            rss_bytes=message.rss_bytes,
            cpu_seconds=message.cpu_seconds,
            cpu_percent=message.cpu_percent,
            threads=message.threads,
            open_fds=message.open_fds,
            gpu_memory_bytes=message.gpu_memory_bytes if message.HasField("gpu_memory_bytes") else None,
            memory_budget_bytes=message.memory_budget_bytes if message.HasField("memory_budget_bytes") else None,
            budget_kind=message.budget_kind,
            over_budget=message.over_budget,
        )


def _resources_json(resources: GroupResources | None) -> JsonObject | None:
    return None if resources is None else resources.to_json()


def _resources_from_json(data: Mapping[str, Any] | None) -> GroupResources | None:
    return None if data is None else GroupResources.from_json(data)


def _resources_proto(resources: GroupResources | None) -> admin_pb2.GroupResources | None:
    return None if resources is None else resources.to_proto()


def _resources_from_proto(
    message: admin_pb2.ProcessGroup | admin_pb2.ReplicaWorker | admin_pb2.GroupStatus | admin_pb2.GroupSummary,
) -> GroupResources | None:
    return GroupResources.from_proto(message.resources) if message.HasField("resources") else None


# -- topology ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaReport:
    """One worker process of a replicated group (`group/i`) and its runtime fields."""

    name: str
    replica: int
    gpu: int | None
    pid: int | None
    """None (or 0 once it came over the wire) while no worker runs."""
    state: str
    restarts: int
    started_at: float | None = None
    physical_gpu: str | None = None
    device: str = ""
    resources: GroupResources | None = None
    host: str = ""
    node_id: str = ""
    node: str | None = None
    """The cluster node resource it is pinned to; None: anywhere (and not shown)."""

    def to_json(self) -> JsonObject:
        body: JsonObject = {
            "name": self.name,
            "replica": self.replica,
            "gpu": self.gpu,
            "pid": self.pid,
            "state": self.state,
            "restarts": self.restarts,
            "started_at": self.started_at,
            "physical_gpu": self.physical_gpu,
            "device": self.device,
            "resources": _resources_json(self.resources),
            "host": self.host,
            "node_id": self.node_id,
        }
        if self.node is not None:
            body["node"] = self.node
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplicaReport:
        return cls(**{**data, "resources": _resources_from_json(data.get("resources"))})

    def to_proto(self) -> admin_pb2.ReplicaWorker:
        return admin_pb2.ReplicaWorker(
            name=self.name,
            replica=self.replica,
            gpu=self.gpu,
            pid=self.pid or 0,
            state=self.state,
            restarts=self.restarts,
            started_at=self.started_at,
            physical_gpu=self.physical_gpu,
            device=self.device,
            resources=_resources_proto(self.resources),
            host=self.host,
            node_id=self.node_id,
            node=self.node,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.ReplicaWorker) -> ReplicaReport:
        return cls(
            name=message.name,
            replica=message.replica,
            gpu=message.gpu if message.HasField("gpu") else None,
            pid=message.pid,
            state=message.state,
            restarts=message.restarts,
            started_at=message.started_at if message.HasField("started_at") else None,
            physical_gpu=message.physical_gpu if message.HasField("physical_gpu") else None,
            device=message.device,
            resources=_resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
            node=message.node if message.HasField("node") else None,
        )


def _autoscale_proto(bounds: Autoscale | None) -> admin_pb2.AutoscaleBounds | None:
    return None if bounds is None else admin_pb2.AutoscaleBounds(**bounds.to_json())


def _autoscale_from_proto(message: admin_pb2.ProcessGroup) -> Autoscale | None:
    if not message.HasField("autoscale"):
        return None
    bounds = message.autoscale
    return Autoscale(
        min_replicas=bounds.min_replicas,
        max_replicas=bounds.max_replicas,
        target_first_audio_p90_seconds=bounds.target_first_audio_p90_seconds,
        target_stall_p90_seconds=(
            bounds.target_stall_p90_seconds if bounds.HasField("target_stall_p90_seconds") else None
        ),
        max_in_flight_per_replica=bounds.max_in_flight_per_replica,
        scale_down_ratio=bounds.scale_down_ratio,
        scale_up_cooldown_seconds=bounds.scale_up_cooldown_seconds,
        scale_down_cooldown_seconds=bounds.scale_down_cooldown_seconds,
        window_seconds=bounds.window_seconds,
    )


@dataclass(frozen=True)
class GroupReport:
    """A process group of the plan with its worker's runtime fields (a replicated group: one entry per replica)."""

    name: str
    stages: tuple[str, ...]
    gpu: int | None
    total_gpu_memory_fraction: float | None
    tp_rank: int | None
    pid: int | None
    """The worker's pid: None (0 over the wire) while none runs, and always None for a replicated group."""
    state: str
    restarts: int
    """Workers started after the first (a replicated group: summed over its replicas)."""
    started_at: float | None = None
    fraction_enforced: bool = False
    physical_gpu: str | None = None
    device: str = ""
    resources: GroupResources | None = None
    host: str = ""
    node_id: str = ""
    node: str | None = None
    autoscale: Autoscale | None = None
    replicas: int = 1
    replica_gpus: tuple[int | None, ...] = ()
    """Each replica's GPU when `replicas` > 1 (shown only then)."""
    workers: tuple[ReplicaReport, ...] = ()
    """One per replica when `replicas` > 1 (shown only then)."""

    @property
    def replicated(self) -> bool:
        return self.replicas > 1

    def to_json(self) -> JsonObject:
        body: JsonObject = {
            "name": self.name,
            "stages": list(self.stages),
            "gpu": self.gpu,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "tp_rank": self.tp_rank,
        }
        if self.replicated:  # the plan's keys, in its order; a single worker keeps the object it always had
            body["replicas"] = self.replicas
            body["replica_gpus"] = list(self.replica_gpus)
        if self.node is not None:
            body["node"] = self.node
        if self.autoscale is not None:
            body["autoscale"] = self.autoscale.to_json()
        body.update(
            pid=self.pid,
            state=self.state,
            restarts=self.restarts,
            started_at=self.started_at,
            fraction_enforced=self.fraction_enforced,
            physical_gpu=self.physical_gpu,
            device=self.device,
            resources=_resources_json(self.resources),
            host=self.host,
            node_id=self.node_id,
        )
        if self.replicated:
            body["workers"] = [w.to_json() for w in self.workers]
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupReport:
        autoscale = data.get("autoscale")
        return cls(
            **{
                **data,
                "stages": tuple(data["stages"]),
                "resources": _resources_from_json(data.get("resources")),
                "autoscale": None if autoscale is None else Autoscale(**autoscale),
                "replica_gpus": tuple(data.get("replica_gpus", ())),
                "workers": tuple(ReplicaReport.from_json(w) for w in data.get("workers", ())),
            }
        )

    def to_proto(self) -> admin_pb2.ProcessGroup:
        return admin_pb2.ProcessGroup(
            name=self.name,
            stages=self.stages,
            gpu=self.gpu,
            total_gpu_memory_fraction=self.total_gpu_memory_fraction,
            tp_rank=self.tp_rank,
            pid=self.pid or 0,
            state=self.state,
            restarts=self.restarts,
            started_at=self.started_at,
            fraction_enforced=self.fraction_enforced,
            physical_gpu=self.physical_gpu,
            device=self.device,
            resources=_resources_proto(self.resources),
            # 0 on the wire for a single worker, as before replicas existed
            replicas=self.replicas if self.replicated else 0,
            workers=[w.to_proto() for w in self.workers] if self.replicated else [],
            node=self.node,
            host=self.host,
            node_id=self.node_id,
            autoscale=_autoscale_proto(self.autoscale),
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.ProcessGroup) -> GroupReport:
        replicated = message.replicas > 1
        workers = tuple(ReplicaReport.from_proto(w) for w in message.workers) if replicated else ()
        return cls(
            name=message.name,
            stages=tuple(message.stages),
            gpu=message.gpu if message.HasField("gpu") else None,
            total_gpu_memory_fraction=(
                message.total_gpu_memory_fraction if message.HasField("total_gpu_memory_fraction") else None
            ),
            tp_rank=message.tp_rank if message.HasField("tp_rank") else None,
            pid=(message.pid or None) if replicated else message.pid,
            state=message.state,
            restarts=message.restarts,
            started_at=message.started_at if message.HasField("started_at") else None,
            fraction_enforced=message.fraction_enforced,
            physical_gpu=message.physical_gpu if message.HasField("physical_gpu") else None,
            device=message.device,
            resources=_resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
            node=message.node if message.HasField("node") else None,
            autoscale=_autoscale_from_proto(message),
            replicas=message.replicas if replicated else 1,
            replica_gpus=tuple(w.gpu for w in workers),
            workers=workers,
        )


@dataclass(frozen=True)
class StageReport:
    """One stage of the plan: its group, GPU (one per rank for a TP stage) and fraction."""

    name: str
    process: str
    gpu: int | tuple[int, ...] | None
    """None for a CPU stage; one id per rank for a TP stage."""
    tp_size: int
    total_gpu_memory_fraction: float | None
    fraction_source: str | None
    stand_in: bool = False

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "process": self.process,
            "gpu": list(self.gpu) if isinstance(self.gpu, tuple) else self.gpu,
            "tp_size": self.tp_size,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "fraction_source": self.fraction_source,
            "stand_in": self.stand_in,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageReport:
        gpu = data["gpu"]
        return cls(**{**data, "gpu": tuple(gpu) if isinstance(gpu, list) else gpu})

    def to_proto(self) -> admin_pb2.Stage:
        gpu = self.gpu
        return admin_pb2.Stage(
            name=self.name,
            process=self.process,
            gpu=[] if gpu is None else (gpu if isinstance(gpu, tuple) else [gpu]),
            tp_size=self.tp_size,
            total_gpu_memory_fraction=self.total_gpu_memory_fraction,
            fraction_source=self.fraction_source,
            stand_in=self.stand_in,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.Stage) -> StageReport:
        return cls(
            name=message.name,
            process=message.process,
            gpu=tuple(message.gpu) if message.tp_size > 1 else (message.gpu[0] if message.gpu else None),
            tp_size=message.tp_size,
            total_gpu_memory_fraction=(
                message.total_gpu_memory_fraction if message.HasField("total_gpu_memory_fraction") else None
            ),
            fraction_source=message.fraction_source if message.HasField("fraction_source") else None,
            stand_in=message.stand_in,
        )


@dataclass(frozen=True)
class EdgeReport:
    """A handoff of the plan and what crosses it at run time."""

    src: str
    dst: str
    kind: str
    """"next" or "stream_to"."""
    cross_process: bool
    process_safe: bool
    transport: str = ""
    """What completed requests used ("in_process", "grpc", "mixed"); the planned transport until one crossed."""
    src_group: str = ""
    dst_group: str = ""
    requests: Mapping[str, int] = field(default_factory=dict)
    """Completed requests that crossed it, by transport."""

    def to_json(self) -> JsonObject:
        return {
            "src": self.src,
            "dst": self.dst,
            "kind": self.kind,
            "cross_process": self.cross_process,
            "process_safe": self.process_safe,
            "transport": self.transport,
            "src_group": self.src_group,
            "dst_group": self.dst_group,
            "requests": dict(self.requests),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EdgeReport:
        return cls(**{**data, "requests": dict(data.get("requests", {}))})

    def to_proto(self) -> admin_pb2.Edge:
        return admin_pb2.Edge(**self.to_json())

    @classmethod
    def from_proto(cls, message: admin_pb2.Edge) -> EdgeReport:
        return cls(
            src=message.src,
            dst=message.dst,
            kind=message.kind,
            cross_process=message.cross_process,
            process_safe=message.process_safe,
            transport=message.transport,
            src_group=message.src_group,
            dst_group=message.dst_group,
            requests=dict(message.requests),
        )


@dataclass(frozen=True)
class GpuReport:
    """One GPU's declared fractions and, where NVML tells, its measured memory."""

    id: int
    total_gpu_memory_fraction: float
    limit: float
    groups: tuple[str, ...]
    total_bytes: int | None = None
    measured_bytes: int | None = None
    over_limit: bool = False
    """measured_bytes > limit x total_bytes."""

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "limit": self.limit,
            "groups": list(self.groups),
            "total_bytes": self.total_bytes,
            "measured_bytes": self.measured_bytes,
            "over_limit": self.over_limit,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuReport:
        return cls(**{**data, "groups": tuple(data["groups"])})

    def to_proto(self) -> admin_pb2.GpuBudget:
        return admin_pb2.GpuBudget(**self.to_json())

    @classmethod
    def from_proto(cls, message: admin_pb2.GpuBudget) -> GpuReport:
        return cls(
            id=message.id,
            total_gpu_memory_fraction=message.total_gpu_memory_fraction,
            limit=message.limit,
            groups=tuple(message.groups),
            total_bytes=message.total_bytes if message.HasField("total_bytes") else None,
            measured_bytes=message.measured_bytes if message.HasField("measured_bytes") else None,
            over_limit=message.over_limit,
        )


@dataclass(frozen=True)
class TopologyReport:
    """The plan the daemon runs plus runtime fields: `stagevisor topology`, GetTopology and GET /v1/topology."""

    model: str | None
    model_path: str | None
    changed: bool
    groups: tuple[GroupReport, ...]
    stages: tuple[StageReport, ...]
    edges: tuple[EdgeReport, ...]
    gpus: tuple[GpuReport, ...]
    warnings: tuple[str, ...] = ()

    def group(self, name: str) -> GroupReport:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def to_json(self) -> JsonObject:
        """The shape of `stagevisor plan --format json` plus the runtime fields."""
        return {
            "model": self.model,
            "model_path": self.model_path,
            "changed": self.changed,
            "groups": [g.to_json() for g in self.groups],
            "stages": [s.to_json() for s in self.stages],
            "edges": [e.to_json() for e in self.edges],
            "gpus": [g.to_json() for g in self.gpus],
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TopologyReport:
        return cls(
            model=data["model"],
            model_path=data["model_path"],
            changed=data["changed"],
            groups=tuple(GroupReport.from_json(g) for g in data["groups"]),
            stages=tuple(StageReport.from_json(s) for s in data["stages"]),
            edges=tuple(EdgeReport.from_json(e) for e in data["edges"]),
            gpus=tuple(GpuReport.from_json(g) for g in data["gpus"]),
            warnings=tuple(data["warnings"]),
        )

    def to_proto(self) -> admin_pb2.Topology:
        return admin_pb2.Topology(
            model=self.model,
            model_path=self.model_path,
            changed=self.changed,
            groups=[g.to_proto() for g in self.groups],
            stages=[s.to_proto() for s in self.stages],
            edges=[e.to_proto() for e in self.edges],
            gpus=[g.to_proto() for g in self.gpus],
            warnings=self.warnings,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.Topology) -> TopologyReport:
        return cls(
            model=message.model if message.HasField("model") else None,
            model_path=message.model_path if message.HasField("model_path") else None,
            changed=message.changed,
            groups=tuple(GroupReport.from_proto(g) for g in message.groups),
            stages=tuple(StageReport.from_proto(s) for s in message.stages),
            edges=tuple(EdgeReport.from_proto(e) for e in message.edges),
            gpus=tuple(GpuReport.from_proto(g) for g in message.gpus),
            warnings=tuple(message.warnings),
        )


# -- status ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RootCause:
    """The first failure the daemon saw: which group (and stage, when a stage failed to build) and why."""

    group: str
    stage: str
    """"" when the failure is not a stage's."""
    message: str
    traceback: str = ""
    time: float = 0.0
    """Unix seconds."""
    recovered_at: float | None = None
    """Unix seconds: when every worker was READY again, which ends the incident; None while it lasts."""

    def to_json(self) -> JsonObject:
        return {
            "group": self.group,
            "stage": self.stage,
            "message": self.message,
            "traceback": self.traceback,
            "time": self.time,
            "recovered_at": self.recovered_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RootCause:
        return cls(**data)

    def to_proto(self) -> admin_pb2.RootCause:
        return admin_pb2.RootCause(**self.to_json())

    @classmethod
    def from_proto(cls, message: admin_pb2.RootCause) -> RootCause:
        return cls(
            group=message.group,
            stage=message.stage,
            message=message.message,
            traceback=message.traceback,
            time=message.time,
            recovered_at=message.recovered_at if message.HasField("recovered_at") else None,
        )


@dataclass(frozen=True)
class GroupStatus:
    """One worker in the daemon's status: a group, or `group/i` for a replica."""

    name: str
    state: str
    pid: int | None
    """None (0 once it came over the wire) while no worker runs."""
    restarts: int
    resources: GroupResources | None = None
    host: str = ""
    node_id: str = ""

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "resources": _resources_json(self.resources),
            "host": self.host,
            "node_id": self.node_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupStatus:
        return cls(**{**data, "resources": _resources_from_json(data.get("resources"))})

    def to_proto(self) -> admin_pb2.GroupStatus:
        return admin_pb2.GroupStatus(
            name=self.name,
            state=self.state,
            pid=self.pid or 0,
            restarts=self.restarts,
            resources=_resources_proto(self.resources),
            host=self.host,
            node_id=self.node_id,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.GroupStatus) -> GroupStatus:
        return cls(
            name=message.name,
            state=message.state,
            pid=message.pid,
            restarts=message.restarts,
            resources=_resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
        )


@dataclass(frozen=True)
class StatusReport:
    """The daemon's state, its workers and the root-cause failure: `stagevisor status` and GetStatus."""

    state: str
    """DaemonState: STARTING, SERVING, DEGRADED, STOPPING, STOPPED."""
    pid: int
    uptime_seconds: float
    groups_ready: int
    groups_total: int
    in_flight: int
    root_cause: RootCause | None
    groups: tuple[GroupStatus, ...]
    warnings: tuple[str, ...] = ()
    metrics_url: str = ""
    """Where Prometheus scrapes; "" when no metrics endpoint is served."""
    missing_replicas: tuple[str, ...] = ()
    """Replicas (`group/i`) not READY while their group serves through others; shown only when some are."""

    def to_json(self) -> JsonObject:
        body: JsonObject = {
            "state": self.state,
            "pid": self.pid,
            "uptime_seconds": self.uptime_seconds,
            "groups_ready": self.groups_ready,
            "groups_total": self.groups_total,
            "in_flight": self.in_flight,
            "root_cause": None if self.root_cause is None else self.root_cause.to_json(),
            "groups": [g.to_json() for g in self.groups],
            "warnings": list(self.warnings),
            "metrics_url": self.metrics_url,
        }
        if self.missing_replicas:
            body["missing_replicas"] = list(self.missing_replicas)
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatusReport:
        root = data["root_cause"]
        return cls(
            **{
                **data,
                "root_cause": None if root is None else RootCause.from_json(root),
                "groups": tuple(GroupStatus.from_json(g) for g in data["groups"]),
                "warnings": tuple(data["warnings"]),
                "missing_replicas": tuple(data.get("missing_replicas", ())),
            }
        )

    def to_proto(self) -> admin_pb2.Status:
        return admin_pb2.Status(
            state=self.state,
            pid=self.pid,
            uptime_seconds=self.uptime_seconds,
            groups_ready=self.groups_ready,
            groups_total=self.groups_total,
            in_flight=self.in_flight,
            root_cause=None if self.root_cause is None else self.root_cause.to_proto(),
            groups=[g.to_proto() for g in self.groups],
            warnings=self.warnings,
            metrics_url=self.metrics_url,
            missing_replicas=self.missing_replicas,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.Status) -> StatusReport:
        return cls(
            state=message.state,
            pid=message.pid,
            uptime_seconds=message.uptime_seconds,
            groups_ready=message.groups_ready,
            groups_total=message.groups_total,
            in_flight=message.in_flight,
            root_cause=RootCause.from_proto(message.root_cause) if message.HasField("root_cause") else None,
            groups=tuple(GroupStatus.from_proto(g) for g in message.groups),
            warnings=tuple(message.warnings),
            metrics_url=message.metrics_url,
            missing_replicas=tuple(message.missing_replicas),
        )


# -- metrics summary ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupSummary:
    """One worker in `stagevisor top`: its state, resources and the requests in its stages now."""

    name: str
    state: str
    pid: int
    restarts: int
    in_flight: int
    resources: GroupResources | None = None

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "in_flight": self.in_flight,
            "resources": _resources_json(self.resources),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupSummary:
        return cls(**{**data, "resources": _resources_from_json(data.get("resources"))})

    def to_proto(self) -> admin_pb2.GroupSummary:
        return admin_pb2.GroupSummary(
            name=self.name,
            state=self.state,
            pid=self.pid,
            restarts=self.restarts,
            in_flight=self.in_flight,
            resources=_resources_proto(self.resources),
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.GroupSummary) -> GroupSummary:
        return cls(
            name=message.name,
            state=message.state,
            pid=message.pid,
            restarts=message.restarts,
            in_flight=message.in_flight,
            resources=_resources_from_proto(message),
        )


@dataclass(frozen=True)
class StageSummary:
    """One stage in `stagevisor top`: requests in it now and its latency over the window."""

    name: str
    group: str
    in_flight: int
    count: int
    """process() calls that finished in the window."""
    p50_seconds: float | None = None
    """None when no call finished in the window."""
    p99_seconds: float | None = None

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "group": self.group,
            "in_flight": self.in_flight,
            "count": self.count,
            "p50_seconds": self.p50_seconds,
            "p99_seconds": self.p99_seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageSummary:
        return cls(**data)

    def to_proto(self) -> admin_pb2.StageSummary:
        return admin_pb2.StageSummary(**self.to_json())

    @classmethod
    def from_proto(cls, message: admin_pb2.StageSummary) -> StageSummary:
        return cls(
            name=message.name,
            group=message.group,
            in_flight=message.in_flight,
            count=message.count,
            p50_seconds=message.p50_seconds if message.HasField("p50_seconds") else None,
            p99_seconds=message.p99_seconds if message.HasField("p99_seconds") else None,
        )


@dataclass(frozen=True)
class SummaryReport:
    """What `stagevisor top` shows (GetMetricsSummary): per worker resources and in flight, per stage latency."""

    state: str
    window_seconds: float
    """The window of the stage quantiles."""
    in_flight: int
    groups: tuple[GroupSummary, ...]
    stages: tuple[StageSummary, ...]
    warnings: tuple[str, ...] = ()

    def to_json(self) -> JsonObject:
        return {
            "state": self.state,
            "window_seconds": self.window_seconds,
            "in_flight": self.in_flight,
            "groups": [g.to_json() for g in self.groups],
            "stages": [s.to_json() for s in self.stages],
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryReport:
        return cls(
            **{
                **data,
                "groups": tuple(GroupSummary.from_json(g) for g in data["groups"]),
                "stages": tuple(StageSummary.from_json(s) for s in data["stages"]),
                "warnings": tuple(data["warnings"]),
            }
        )

    def to_proto(self) -> admin_pb2.MetricsSummary:
        return admin_pb2.MetricsSummary(
            state=self.state,
            window_seconds=self.window_seconds,
            in_flight=self.in_flight,
            groups=[g.to_proto() for g in self.groups],
            stages=[s.to_proto() for s in self.stages],
            warnings=self.warnings,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.MetricsSummary) -> SummaryReport:
        return cls(
            state=message.state,
            window_seconds=message.window_seconds,
            in_flight=message.in_flight,
            groups=tuple(GroupSummary.from_proto(g) for g in message.groups),
            stages=tuple(StageSummary.from_proto(s) for s in message.stages),
            warnings=tuple(message.warnings),
        )
