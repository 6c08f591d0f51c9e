"""The metrics summary (`stagevisor top`, GetMetricsSummary): per worker resources and in flight, per stage latency."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.reports.resources import (
    GroupResources,
    JsonObject,
    resources_from_json,
    resources_from_proto,
    resources_json,
    resources_proto,
)


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
            "resources": resources_json(self.resources),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupSummary:
        return cls(**{**data, "resources": resources_from_json(data.get("resources"))})

    def to_proto(self) -> admin_pb2.GroupSummary:
        return admin_pb2.GroupSummary(
            name=self.name,
            state=self.state,
            pid=self.pid,
            restarts=self.restarts,
            in_flight=self.in_flight,
            resources=resources_proto(self.resources),
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.GroupSummary) -> GroupSummary:
        return cls(
            name=message.name,
            state=message.state,
            pid=message.pid,
            restarts=message.restarts,
            in_flight=message.in_flight,
            resources=resources_from_proto(message),
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
