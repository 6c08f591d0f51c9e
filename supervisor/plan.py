"""The Plan: a validated process topology, the pure output of placement and the input of the daemon."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

FractionSource = Literal["declared", "recommended"]
EdgeKind = Literal["next", "stream_to"]

STANDIN_FACTORY = "stagevisor.stages.standins:make"
"""The factory of the seed models' stand-in executors: their stages, the default voice's weights."""


@dataclass(frozen=True)
class PlannedStage:
    """One stage as it will run: where, on which GPU, under which memory fraction."""

    name: str
    process: str
    """The process name this stage was placed in (before `_tp<rank>` expansion)."""
    gpu: int | tuple[int, ...] | None
    """None for a CPU stage; a tuple of GPU ids (one per rank) for a TP stage."""
    tp_size: int
    total_gpu_memory_fraction: float | None
    fraction_source: FractionSource | None
    factory: str | None
    """Import path `module:callable` that builds the executor; None only in declarations not meant to run."""
    args: Mapping[str, Any] = field(default_factory=dict)
    next: tuple[str, ...] = ()
    stream_to: tuple[str, ...] = ()

    @property
    def stand_in(self) -> bool:
        """True when a stand-in executor runs this stage (the default voice, not the model's weights)."""
        return self.factory == STANDIN_FACTORY

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "process": self.process,
            "gpu": list(self.gpu) if isinstance(self.gpu, tuple) else self.gpu,
            "tp_size": self.tp_size,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "fraction_source": self.fraction_source,
            "stand_in": self.stand_in,
        }


@dataclass(frozen=True)
class Autoscale:
    """A group's replica bounds and the targets the daemon's autoscaler holds it to (YAML `processes.<name>.autoscale`).

    Up: one replica more while first audio p90 (or playback stall p90) is over its target, or the group holds
    more than `max_in_flight_per_replica` requests per replica. Down: one fewer once every signal has stayed
    below `scale_down_ratio` of its target for `scale_down_cooldown_seconds`.
    """

    min_replicas: int
    max_replicas: int
    target_first_audio_p90_seconds: float
    target_stall_p90_seconds: float | None
    max_in_flight_per_replica: float
    scale_down_ratio: float
    scale_up_cooldown_seconds: float
    scale_down_cooldown_seconds: float
    window_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class ProcessGroup:
    """Stages that share one worker OS process. A TP stage has one group per rank."""

    name: str
    stages: tuple[str, ...]
    gpu: int | None
    total_gpu_memory_fraction: float | None
    """Sum of the fractions its stages declare on its GPU; None when none declare one."""
    tp_rank: int | None = None
    tp_size: int = 1
    replicas: int = 1
    """Worker processes that each run all of the group's stages; requests are spread over them."""
    replica_gpus: tuple[int | None, ...] = ()
    """The GPU of each replica when `replicas` > 1 (replica 0's is `gpu`); empty for a single worker."""
    spread_gpus: tuple[int, ...] = ()
    """The GPUs declared for its replicas (YAML `processes.<name>.gpus`); `scale` keeps spreading over them."""
    node: str | None = None
    """Where a cluster launcher places its workers (config `processes: NAME: node:`); None: anywhere."""
    autoscale: Autoscale | None = None
    """Replica bounds and targets when the daemon scales this group itself; None: replicas change only by hand."""

    def workers(self) -> tuple["Worker", ...]:
        """The worker processes this group runs: one, or one per replica."""
        if self.replicas == 1:
            return (Worker(self.name, self.name, None, self.gpu),)
        gpus = self.replica_gpus or (self.gpu,) * self.replicas
        return tuple(Worker(replica_name(self.name, i), self.name, i, gpu) for i, gpu in enumerate(gpus))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "stages": list(self.stages),
            "gpu": self.gpu,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "tp_rank": self.tp_rank,
        }
        if self.replicas > 1:  # a single worker keeps the object it always had
            body["replicas"] = self.replicas
            body["replica_gpus"] = [w.gpu for w in self.workers()]
        if self.node is not None:
            body["node"] = self.node
        if self.autoscale is not None:
            body["autoscale"] = self.autoscale.to_json()
        return body


def replica_name(group: str, index: int) -> str:
    """How an operator addresses one replica of a group: `vocoder/1`."""
    return f"{group}/{index}"


@dataclass(frozen=True)
class Worker:
    """One worker process of the Plan: a group's only worker, or one of its replicas."""

    name: str
    """The group's name for a single worker, `group/index` for a replica."""
    group: str
    replica: int | None
    """The replica index, None when the group runs a single worker."""
    gpu: int | None


@dataclass(frozen=True)
class Edge:
    """A handoff between two stages; one entry per (src, dst, kind)."""

    src: str
    dst: str
    kind: EdgeKind
    cross_process: bool
    process_safe: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "kind": self.kind,
            "cross_process": self.cross_process,
            "process_safe": self.process_safe,
        }


@dataclass(frozen=True)
class GpuBudget:
    """Placement accounting for one GPU: the declared fractions of every group on it."""

    id: int
    total_gpu_memory_fraction: float | None
    """The sum of the fractions its stages declare; None when none declares one (one process alone on the GPU,
    which needs none), as a group's is: 0 would read as a declared share of nothing."""
    limit: float
    groups: tuple[str, ...]
    """The workers on this GPU: group names, `group/index` for replicas."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "total_gpu_memory_fraction": self.total_gpu_memory_fraction,
            "limit": self.limit,
            "groups": list(self.groups),
        }


@dataclass(frozen=True)
class Plan:
    """A validated topology. Groups are ordered by their first stage in config order."""

    model: str | None
    model_path: str | None
    changed: bool
    stages: tuple[PlannedStage, ...]
    groups: tuple[ProcessGroup, ...]
    edges: tuple[Edge, ...]
    gpus: tuple[GpuBudget, ...]
    warnings: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    """Modules the model declares its CPU workers import once in the fork server (not part of to_json)."""

    def stage(self, name: str) -> PlannedStage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def group(self, name: str) -> ProcessGroup:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def workers(self) -> tuple[Worker, ...]:
        """Every worker process the Plan starts, in group order."""
        return tuple(w for g in self.groups for w in g.workers())

    def group_of(self, stage: str) -> ProcessGroup:
        """The group that receives the stage's requests (rank 0 for a TP stage)."""
        for group in self.groups:
            if stage in group.stages and group.tp_rank in (None, 0):
                return group
        raise KeyError(stage)

    def to_json(self) -> dict[str, Any]:
        """The `stagevisor plan --format json` object (docs/placement.md, "Output")."""
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
