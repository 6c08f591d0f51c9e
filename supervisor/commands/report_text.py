"""The text form of what the admin commands print: topology and status tables, one line per lifecycle event."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.numbers import counted

if TYPE_CHECKING:  # the reports and messages import protobuf, which `stagevisor plan` does without
    from stagevisor.supervisor._proto import admin_pb2
    from stagevisor.supervisor.reports import (
        GroupReport,
        GroupResources,
        GroupStatus,
        ReplicaReport,
        StatusReport,
        TopologyReport,
    )


def format_event(event: admin_pb2.LifecycleEvent) -> str:
    """`HH:MM:SS group: OLD -> NEW pid N (reason)` for one LifecycleEvent; `HH:MM:SS group: WARNING reason`
    for a condition (a group over its memory budget), `HH:MM:SS APPLIED reason` for one of the whole daemon."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
    if event.kind:
        return f"{stamp} {f'{event.group}: ' if event.group else ''}{event.kind} {event.reason}"
    pid = f" pid {event.pid}" if event.pid else ""
    reason = f" ({event.reason})" if event.reason else ""
    return f"{stamp} {event.group}: {event.old_state} -> {event.new_state}{pid}{reason}"


def event_json(event: admin_pb2.LifecycleEvent, replayed: bool) -> dict[str, Any]:
    """One LifecycleEvent as `stagevisor events --format json` prints it. An event of the whole daemon (an apply,
    no group) has no states: null, not a group's READY -> READY."""
    states = (event.old_state, event.new_state) if event.group else (None, None)
    return {
        "group": event.group,
        "old_state": states[0],
        "new_state": states[1],
        "pid": event.pid or None,
        "reason": event.reason,
        "time": event.time,
        "kind": event.kind or "TRANSITION",
        "replayed": replayed,
    }


def _fmt_fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def format_bytes(value: float | None) -> str:
    """Bytes as MiB or GiB; "n/a" for None (not measurable here, e.g. GPU memory on a CPU machine)."""
    if value is None:
        return "n/a"
    if value >= 1024**3:
        return f"{value / 1024**3:.2f} GiB"
    return f"{value / 1024**2:.1f} MiB"


def _clock(unix_seconds: float) -> str:
    """Local date and time to the second: an incident may be days old."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_seconds))


def format_memory(res: GroupResources | None, pid: int | None) -> str:
    """`rss 120.3 MiB, gpu n/a, budget 256.0 MiB (rss)` plus ` OVER BUDGET` when it is; `pid`: the worker's."""
    if not pid:
        return "memory: no process"  # its last sample would read as a worker using 0 bytes
    if res is None:
        return "memory: not sampled yet"
    text = f"rss {format_bytes(res.rss_bytes)}, gpu {format_bytes(res.gpu_memory_bytes)}"
    if res.memory_budget_bytes is not None:
        text += f", budget {format_bytes(res.memory_budget_bytes)} ({res.budget_kind})"
    else:
        text += ", budget -"
    return text + (" OVER BUDGET" if res.over_budget else "")


def _device_text(worker: GroupReport | ReplicaReport) -> str:
    """` (physical 3, cuda:0 (NVIDIA H200, GPU-...))`: the device a GPU group's worker is isolated to and runs on."""
    parts = [f"physical {worker.physical_gpu}"] if worker.physical_gpu else []
    if worker.gpu is not None and worker.device:
        parts.append(f"on {worker.device}")
    return f" ({', '.join(parts)})" if parts else ""


def _node_text(worker: GroupReport | ReplicaReport | GroupStatus, node: str | None = None) -> str:
    """`  on host vm, node 3f2a9c01d4e5 (pinned: tts-a)`: where a worker on a cluster runs (and is pinned)."""
    text = f"  on host {worker.host or '-'}, node {(worker.node_id or '-')[:12]}"
    return text + (f" (pinned: {node})" if node else "")


def _silent_text(worker: GroupReport | ReplicaReport | GroupStatus) -> str:
    """`  silent 4.2s` for a READY worker the daemon took for silent (it missed heartbeats); empty while it beats."""
    return "" if worker.silent_s is None else f"  silent {worker.silent_s:.1f}s"


def _autoscale_text(group: GroupReport) -> str:
    bounds = group.autoscale
    if bounds is None:
        return ""
    return f"  autoscale {bounds.min_replicas}-{bounds.max_replicas} replicas"


def format_topology(report: TopologyReport) -> str:
    """The plan's group lines (`name : stage, stage`, padded) with runtime columns, then edges and GPUs."""
    groups = report.groups
    width = max((len(g.name) for g in groups), default=0)
    stage_width = max((len(", ".join(g.stages)) for g in groups), default=0)
    # The path it was asked by, where one was given and differs from the key (`model: higgs-tts
    # (bosonai/higgs-tts-3-4b)`); the default voice, asked by no path, is its key alone.
    path = f" ({report.model_path})" if report.model_path and report.model_path != report.model else ""
    lines = [f"model: {report.model or '-'}{path}"]
    standins = [s.name for s in report.stages if s.stand_in]
    if standins:
        lines.append(f"stand-ins: {', '.join(standins)} (the default voice, not the model's weights)")
    on_cluster = any(g.node_id or g.node or any(w.node_id for w in g.workers) for g in groups)
    for g in groups:
        fraction = _fmt_fraction(g.total_gpu_memory_fraction)
        if g.total_gpu_memory_fraction is not None:
            fraction += " enforced" if g.fraction_enforced else " not enforced"
        lines.append(
            f"{g.name:<{width}} : {', '.join(g.stages):<{stage_width}}  "
            f"pid {g.pid or '-':<7} {g.state:<8} restarts {g.restarts:<3} "
            f"gpu {'-' if g.gpu is None else g.gpu}{_device_text(g)}  fraction {fraction}  "
            # A replicated group's memory is its replicas', each on its own line below; never sampled as one.
            f"{format_memory(g.resources, g.pid) if not g.workers else 'memory: per replica'}"
            + (_node_text(g, g.node) if on_cluster else "")
            + _autoscale_text(g)
            + _silent_text(g)
        )
        for w in g.workers:  # a replicated group: one line per replica
            lines.append(
                f"  {w.name:<{width}} pid {w.pid or '-':<7} {w.state:<8} restarts {w.restarts:<3} "
                f"gpu {'-' if w.gpu is None else w.gpu}{_device_text(w)}  {format_memory(w.resources, w.pid)}"
                + (_node_text(w, w.node) if on_cluster else "")
                + _silent_text(w)
            )
    if report.edges:
        lines.append("edges:")
        for e in report.edges:
            link = f" ({e.src_group} -> {e.dst_group})" if e.transport != "in_process" else ""
            seen = ", ".join(f"{n} via {t}" for t, n in sorted(e.requests.items()))
            lines.append(
                f"  {e.src} -> {e.dst} [{e.kind}] {e.transport}{link}"
                + (f"  completed requests: {seen}" if seen else "")
            )
    for gpu in report.gpus:
        if gpu.total_bytes is not None:
            measured = f", measured {format_bytes(gpu.measured_bytes)} of {format_bytes(gpu.total_bytes)}" + (
                " OVER LIMIT" if gpu.over_limit else ""
            )
        else:
            measured = ", measured n/a"
        share = (
            f"no fractions declared, limit {gpu.limit:g}"  # as `plan` says it: one process alone needs none
            if gpu.total_gpu_memory_fraction is None
            else f"{gpu.total_gpu_memory_fraction:g} of {gpu.limit:g}"
        )
        lines.append(f"gpu {gpu.id}: {share} ({', '.join(gpu.groups)}){measured}")
    lines.extend(f"warning: {w}" for w in report.warnings)
    return "\n".join(lines)


def format_status(report: StatusReport) -> str:
    workers = (
        f" ({report.workers_ready}/{report.workers_total} workers)"
        if report.workers_total != report.groups_total
        else ""
    )
    # A silent worker stays READY, yet its group may not answer: said beside the count, which would otherwise
    # read `2/2 READY` next to a daemon DEGRADED by it.
    silent = [g.name for g in report.groups if g.silent_s is not None]
    quiet = f", {counted(len(silent), 'worker')} silent ({', '.join(silent)})" if silent else ""
    lines = [
        f"daemon: {report.state} (pid {report.pid}, up {report.uptime_seconds:.0f}s)",
        f"groups: {report.groups_ready}/{report.groups_total} READY{workers}{quiet}, "
        f"{counted(report.in_flight, 'request')} in flight",
    ]
    width = max((len(g.name) for g in report.groups), default=0)
    on_cluster = any(g.node_id for g in report.groups)
    for g in report.groups:
        lines.append(
            f"  {g.name:<{width}}  {g.state:<8} pid {g.pid or '-':<7} restarts {g.restarts:<3} "
            f"{format_memory(g.resources, g.pid)}" + (_node_text(g) if on_cluster else "") + _silent_text(g)
        )
    if report.missing_replicas:
        serving = " (DEGRADED: their groups serve through the other replicas)" if report.state == "SERVING" else ""
        lines.append(f"replicas taking no requests: {', '.join(report.missing_replicas)}{serving}")
    root = report.root_cause
    if root is not None:
        where = f", stage {root.stage!r}" if root.stage else ""
        if root.recovered_at is None:
            lines.append(f"root cause: group {root.group!r}{where}: {root.message}")
        else:
            lines.append(
                f"last incident (over: every worker READY since {_clock(root.recovered_at)}): "
                f"group {root.group!r}{where} at {_clock(root.time)}: {root.message}"
            )
    lines.extend(f"warning: {w}" for w in report.warnings)
    if report.listen:
        lines.append(f"listen: {report.listen}")
    if report.http_url:
        lines.append(f"http: {report.http_url}")
    if report.metrics_url:
        lines.append(f"metrics: {report.metrics_url}")
    return "\n".join(lines)
