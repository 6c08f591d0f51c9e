"""The status report (`stagevisor status`, GetStatus): the daemon's state, its workers and the root-cause failure."""

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
    silent_s: float | None = None
    """Seconds since the daemon took its READY worker for silent (it missed heartbeats: a frozen process, a blocked
    event loop), which it stays until it beats again or is killed at the heartbeat timeout; None while it beats."""

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "state": self.state,
            "pid": self.pid,
            "restarts": self.restarts,
            "resources": resources_json(self.resources),
            "host": self.host,
            "node_id": self.node_id,
            "silent_s": self.silent_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupStatus:
        return cls(**{**data, "resources": resources_from_json(data.get("resources"))})

    def to_proto(self) -> admin_pb2.GroupStatus:
        return admin_pb2.GroupStatus(
            name=self.name,
            state=self.state,
            pid=self.pid or 0,
            restarts=self.restarts,
            resources=resources_proto(self.resources),
            host=self.host,
            node_id=self.node_id,
            silent_s=self.silent_s,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.GroupStatus) -> GroupStatus:
        return cls(
            name=message.name,
            state=message.state,
            pid=message.pid,
            restarts=message.restarts,
            resources=resources_from_proto(message),
            host=message.host,
            node_id=message.node_id,
            silent_s=message.silent_s if message.HasField("silent_s") else None,
        )


@dataclass(frozen=True)
class StatusReport:
    """The daemon's state, its workers and the root-cause failure: `stagevisor status` and GetStatus."""

    state: str
    """DaemonState: STARTING, SERVING, DEGRADED, STOPPING, STOPPED."""
    pid: int
    uptime_seconds: float
    groups_ready: int
    """Process groups with a READY worker (a replicated group: at least one replica)."""
    groups_total: int
    """Process groups in the topology."""
    in_flight: int
    root_cause: RootCause | None
    groups: tuple[GroupStatus, ...]
    """One entry per worker process: a group's, or `group/i` for each replica."""
    workers_ready: int
    workers_total: int
    warnings: tuple[str, ...] = ()
    metrics_url: str = ""
    """Where Prometheus scrapes; "" when no metrics endpoint is served."""
    missing_replicas: tuple[str, ...] = ()
    """Replicas (`group/i`) not READY while their group serves through others; shown only when some are."""
    listen: str = ""
    """The public endpoint's address as bound (a `--listen HOST:0` shows its port); "" before it is bound."""
    http_url: str = ""
    """The HTTP API's URL as bound; "" with `--http none`."""

    def to_json(self) -> JsonObject:
        body: JsonObject = {
            "state": self.state,
            "pid": self.pid,
            "uptime_seconds": self.uptime_seconds,
            "groups_ready": self.groups_ready,
            "groups_total": self.groups_total,
            "workers_ready": self.workers_ready,
            "workers_total": self.workers_total,
            "in_flight": self.in_flight,
            "root_cause": None if self.root_cause is None else self.root_cause.to_json(),
            "groups": [g.to_json() for g in self.groups],
            "warnings": list(self.warnings),
            "metrics_url": self.metrics_url,
            "listen": self.listen,
            "http_url": self.http_url,
        }
        if self.missing_replicas:
            body["missing_replicas"] = list(self.missing_replicas)
        return body

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatusReport:
        root = data["root_cause"]
        groups = tuple(GroupStatus.from_json(g) for g in data["groups"])
        return cls(
            **{
                # A daemon from before the worker counts wrote none: they count the entries of `groups`.
                "workers_ready": sum(g.state == "READY" for g in groups),
                "workers_total": len(groups),
                **data,
                "root_cause": None if root is None else RootCause.from_json(root),
                "groups": groups,
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
            workers_ready=self.workers_ready,
            workers_total=self.workers_total,
            in_flight=self.in_flight,
            root_cause=None if self.root_cause is None else self.root_cause.to_proto(),
            groups=[g.to_proto() for g in self.groups],
            warnings=self.warnings,
            metrics_url=self.metrics_url,
            missing_replicas=self.missing_replicas,
            listen=self.listen,
            http_url=self.http_url,
        )

    @classmethod
    def from_proto(cls, message: admin_pb2.Status) -> StatusReport:
        return cls(
            state=message.state,
            pid=message.pid,
            uptime_seconds=message.uptime_seconds,
            groups_ready=message.groups_ready,
            groups_total=message.groups_total,
            workers_ready=message.workers_ready,
            workers_total=message.workers_total,
            in_flight=message.in_flight,
            root_cause=RootCause.from_proto(message.root_cause) if message.HasField("root_cause") else None,
            groups=tuple(GroupStatus.from_proto(g) for g in message.groups),
            warnings=tuple(message.warnings),
            metrics_url=message.metrics_url,
            missing_replicas=tuple(message.missing_replicas),
            listen=message.listen,
            http_url=message.http_url,
        )
