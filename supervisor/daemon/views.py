"""The daemon's reports: its topology with each group's, edge's and GPU's runtime fields, its status, the summary
`stagevisor top` shows and the voices its executors declared, each built from the daemon's state (a ViewHost).

Read-only: nothing here changes the daemon; the admin API and the HTTP API serve what these return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol

from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState
from stagevisor.supervisor.daemon.replicas import ReplicaSets
from stagevisor.supervisor.daemon.runner import WorkerRunner
from stagevisor.supervisor.plan import Edge, Plan, ProcessGroup
from stagevisor.supervisor.reports import (
    EdgeReport,
    GroupReport,
    GroupStatus,
    ReplicaReport,
    RootCause,
    StageReport,
    StatusReport,
    SummaryReport,
    TopologyReport,
)

if TYPE_CHECKING:
    from stagevisor.supervisor.daemon.monitor import Monitor


class ReportGateway(Protocol):
    """What the reports read of the data plane's gateway: requests in flight, and per edge its transport and counts."""

    def in_flight(self) -> int: ...

    def edge_transports(self) -> dict[tuple[str, str], str]: ...

    def edge_requests(self) -> dict[tuple[str, str], dict[str, int]]: ...


class ViewHost(Protocol):
    """What the reports read of the daemon (core.py's Daemon)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> DaemonState: ...

    @property
    def pid(self) -> int: ...

    @property
    def uptime(self) -> float:
        """Seconds since the daemon started."""

    @property
    def gateway(self) -> ReportGateway: ...

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name -> its runner, in plan order."""

    @property
    def replicas(self) -> ReplicaSets: ...

    @property
    def monitor(self) -> Monitor:
        """Resources, GPU figures, warnings and the metrics summary per worker."""

    @property
    def public_address(self) -> str:
        """The public endpoint's address as bound ("" before it is)."""

    @property
    def http_url(self) -> str:
        """The HTTP API's URL as bound ("" without one)."""

    def root_cause(self) -> RootCause | None:
        """The first failure of the incident status reports (None: no failure since every worker last was READY)."""

    def serving_groups(self) -> set[str]:
        """The process groups that have a READY worker (a replicated group: one replica is enough)."""


def group_report(group: ProcessGroup, runner: WorkerRunner, monitor: Monitor) -> GroupReport:
    """A single-worker group with its worker's runtime fields."""
    return GroupReport(
        name=group.name,
        stages=group.stages,
        gpu=group.gpu,
        total_gpu_memory_fraction=group.total_gpu_memory_fraction,
        tp_rank=group.tp_rank,
        pid=runner.pid,
        state=runner.state.value,
        restarts=runner.restarts,
        started_at=runner.started_at,
        fraction_enforced=runner.fraction_enforced,
        physical_gpu=runner.physical_gpu,
        device=runner.device,
        resources=monitor.resources(runner.name),
        host=runner.host,
        node_id=runner.node_id,
        node=group.node,
        autoscale=group.autoscale,
        silent_s=runner.silent_s(),
    )


def replicated_report(group: ProcessGroup, replicas: ReplicaSets, monitor: Monitor) -> GroupReport:
    """A replicated group: no pid of its own, its restarts summed, one entry per replica (`group/i`)."""
    runners = replicas.runners_of(group.name)
    workers = tuple(
        ReplicaReport(
            name=r.name,
            replica=index,
            gpu=r.spec.group.gpu,
            pid=r.pid,
            state=r.state.value,
            restarts=r.restarts,
            started_at=r.started_at,
            physical_gpu=r.physical_gpu,
            device=r.device,
            resources=monitor.resources(r.name),
            host=r.host,
            node_id=r.node_id,
            node=r.spec.group.node or None,
            silent_s=r.silent_s(),
        )
        for index, r in enumerate(runners)
    )
    return GroupReport(
        name=group.name,
        stages=group.stages,
        gpu=group.gpu,
        total_gpu_memory_fraction=group.total_gpu_memory_fraction,
        tp_rank=group.tp_rank,
        pid=None,
        state=replicas.group_state(group.name).value,
        restarts=sum(r.restarts for r in runners),
        fraction_enforced=all(r.fraction_enforced for r in runners),
        node=group.node,
        autoscale=group.autoscale,
        replicas=group.replicas,
        replica_gpus=tuple(w.gpu for w in group.workers()),
        workers=workers,
    )


def edge_report(
    plan: Plan,
    edge: Edge,
    node_of: Mapping[str, str],
    transports: Mapping[tuple[str, str], str],
    observed: Mapping[tuple[str, str], Mapping[str, int]],
) -> EdgeReport:
    """An edge with the transport its requests used (the planned one until a request crossed it)."""
    src_group = plan.group_of(edge.src).name
    dst_group = plan.group_of(edge.dst).name
    fallback = "grpc" if edge.cross_process else "in_process"
    if fallback == "grpc" and "" != node_of[src_group] != node_of[dst_group] != "":
        fallback = "grpc_tcp"  # groups on two Ray nodes, before any request crossed the edge
    return EdgeReport(
        src=edge.src,
        dst=edge.dst,
        kind=edge.kind,
        cross_process=edge.cross_process,
        process_safe=edge.process_safe,
        transport=transports.get((edge.src, edge.dst), fallback),
        src_group=src_group,
        dst_group=dst_group,
        requests=observed.get((edge.src, edge.dst), {}),
    )


def topology(host: ViewHost) -> TopologyReport:
    """The plan (`stagevisor plan --format json`) plus runtime fields per group, edge and GPU.

    A replicated group gets `workers`: one entry per replica (`group/i`)
    with its own runtime fields; its own pid is None, its restarts the sum.
    """
    plan = host.plan
    groups = tuple(
        group_report(g, runner, host.monitor)
        if (runner := host.runners.get(g.name))
        else replicated_report(g, host.replicas, host.monitor)
        for g in plan.groups
    )
    node_of = {g.name: g.node_id for g in groups}
    transports = host.gateway.edge_transports()
    observed = host.gateway.edge_requests()
    return TopologyReport(
        model=plan.model,
        model_path=plan.model_path,
        changed=plan.changed,
        groups=groups,
        stages=tuple(
            StageReport(s.name, s.process, s.gpu, s.tp_size, s.total_gpu_memory_fraction, s.fraction_source, s.stand_in)
            for s in plan.stages
        ),
        edges=tuple(edge_report(plan, e, node_of, transports, observed) for e in plan.edges),
        gpus=tuple(host.monitor.gpu_report(b) for b in plan.gpus),
        warnings=plan.warnings,
    )


def status(host: ViewHost) -> StatusReport:
    """The daemon's state, each worker's, the root cause of the incident now, and the warnings in force."""
    groups = tuple(
        GroupStatus(
            name=r.name,
            state=r.state.value,
            pid=r.pid,
            restarts=r.restarts,
            resources=host.monitor.resources(r.name),
            host=r.host,
            node_id=r.node_id,
            silent_s=r.silent_s(),
        )
        for r in host.runners.values()
    )
    planned = {group.name for group in host.plan.groups}
    return StatusReport(
        state=host.state.value,
        pid=host.pid,
        uptime_seconds=host.uptime,
        groups_ready=len(planned & host.serving_groups()),
        groups_total=len(planned),
        in_flight=host.gateway.in_flight(),
        root_cause=host.root_cause(),
        groups=groups,
        workers_ready=sum(g.state == GroupState.READY.value for g in groups),
        workers_total=len(groups),
        warnings=tuple(host.monitor.warnings()),
        metrics_url=host.monitor.metrics_url,
        # Only while some are: a replicated group serving through its other replicas.
        missing_replicas=tuple(host.replicas.missing()),
        listen=host.public_address,
        http_url=host.http_url,
    )


def summary(host: ViewHost) -> SummaryReport:
    """Per group and stage what `stagevisor top` shows."""
    return host.monitor.summary(host.state.value, host.gateway.in_flight())


def voices(runners: Mapping[str, WorkerRunner]) -> list[dict[str, Any]]:
    """The voices the executors declared in their READY handshakes, each once, in plan order."""
    seen: dict[str, dict[str, Any]] = {}
    for runner in runners.values():
        for voice in runner.voices:
            seen.setdefault(str(voice.get("id")), voice)
    return list(seen.values())
