"""What the daemon measured of one worker (GroupResources), which the topology, status and summary reports share.

Also JsonObject, the JSON form every report converts to, and the conversions of
an optional GroupResources that each report's worker entry uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stagevisor.supervisor._proto import admin_pb2

JsonObject = dict[str, Any]


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


def resources_json(resources: GroupResources | None) -> JsonObject | None:
    return None if resources is None else resources.to_json()


def resources_from_json(data: Mapping[str, Any] | None) -> GroupResources | None:
    return None if data is None else GroupResources.from_json(data)


def resources_proto(resources: GroupResources | None) -> admin_pb2.GroupResources | None:
    return None if resources is None else resources.to_proto()


def resources_from_proto(
    message: admin_pb2.ProcessGroup | admin_pb2.ReplicaWorker | admin_pb2.GroupStatus | admin_pb2.GroupSummary,
) -> GroupResources | None:
    return GroupResources.from_proto(message.resources) if message.HasField("resources") else None
