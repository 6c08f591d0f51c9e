"""The topology report (`stagevisor topology`, GetTopology, GET /v1/topology): the plan plus runtime fields.

Its groups (with one entry per replica of a replicated group), stages, edges and GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.plan import Autoscale
from stagevisor.supervisor.reports.resources import (
    GroupResources,
    JsonObject,
    resources_from_json,
    resources_from_proto,
    resources_json,
    resources_proto,
)


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
    silent_s: float | None = None
    """Seconds since the daemon took its READY worker for silent (missed heartbeats); None while it beats."""

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
            "resources": resources_json(self.resources),
            "host": self.host,
            "node_id": self.node_id,
            "silent_s": self.silent_s,
        }
        if self.node is not None:
            body["node"] = self.node
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReplicaReport:
        return cls(**{**data, "resources": resources_from_json(data.get("resources"))})

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
            resources=resources_proto(self.resources),
            host=self.host,
            node_id=self.node_id,
            node=self.node,
            silent_s=self.silent_s,
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
            resources=resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
            node=message.node if message.HasField("node") else None,
            silent_s=message.silent_s if message.HasField("silent_s") else None,
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
    silent_s: float | None = None
    """Seconds since the daemon took its READY worker for silent (missed heartbeats); None while it beats, and
    always for a replicated group (each of its `workers` has its own)."""

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
            resources=resources_json(self.resources),
            host=self.host,
            node_id=self.node_id,
            silent_s=self.silent_s,
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
                "resources": resources_from_json(data.get("resources")),
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
            resources=resources_proto(self.resources),
            # 0 on the wire for a single worker, as before replicas existed
            replicas=self.replicas if self.replicated else 0,
            workers=[w.to_proto() for w in self.workers] if self.replicated else [],
            node=self.node,
            host=self.host,
            node_id=self.node_id,
            autoscale=_autoscale_proto(self.autoscale),
            silent_s=self.silent_s,
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
            resources=resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
            node=message.node if message.HasField("node") else None,
            autoscale=_autoscale_from_proto(message),
            replicas=message.replicas if replicated else 1,
            replica_gpus=tuple(w.gpu for w in workers),
            workers=workers,
            silent_s=message.silent_s if message.HasField("silent_s") else None,
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
    """Completed requests that crossed it, by transport: a request that failed or was cancelled is not counted
    (stagevisor_edge_handoffs_total counts every handoff, theirs too)."""

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
    total_gpu_memory_fraction: float | None
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
            total_gpu_memory_fraction=(
                message.total_gpu_memory_fraction if message.HasField("total_gpu_memory_fraction") else None
            ),
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
