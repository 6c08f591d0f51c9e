"""Recorder: what one worker measures of its stages and incoming handoffs, reported to the daemon as deltas.

The hot path only appends to lists and bumps integers on objects bound once per
stage and edge (no locks, no label lookups, no prometheus_client calls): the
event loop is single-threaded. Every REPORT_INTERVAL the worker's node sends
`collect()` — what changed since the previous report — to the daemon, which
accumulates it; so a worker that restarts starts from zero without resetting
or doubling the daemon's counters.
"""

from __future__ import annotations

import os

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.metrics.buckets import bin_values

REPORT_INTERVAL = 0.5
"""Seconds between a worker's metric reports."""
IN_PROCESS, GRPC, SHARED_MEMORY = "in_process", "grpc", "shared_memory"


class StageStats:
    """One stage's process() calls since the last report, and how many run now."""

    __slots__ = ("durations", "in_flight", "failures", "_reported_in_flight")

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.in_flight = 0
        self.failures = 0
        self._reported_in_flight = 0


class EdgeStats:
    """Handoffs received over one edge by one transport since the last report."""

    __slots__ = ("handoffs", "chunks", "bytes", "latencies")

    def __init__(self) -> None:
        self.handoffs = 0
        self.chunks = 0
        self.bytes = 0
        self.latencies: list[float] = []


class Recorder:
    """The metrics of one worker process; the runtime binds stage and edge stats once and updates them."""

    def __init__(self, group: str, pid: int | None = None) -> None:
        self.group = group
        self.pid = os.getpid() if pid is None else pid
        self.stages: dict[str, StageStats] = {}
        self.edges: dict[tuple[str, str, str], EdgeStats] = {}

    def stage(self, name: str) -> StageStats:
        stats = self.stages.get(name)
        if stats is None:
            stats = self.stages[name] = StageStats()
        return stats

    def edge(self, src: str, dst: str, transport: str) -> EdgeStats:
        key = (src, dst, transport)
        stats = self.edges.get(key)
        if stats is None:
            stats = self.edges[key] = EdgeStats()
        return stats

    def collect(self) -> pb.MetricsReport | None:
        """The deltas since the previous call (None when nothing changed); resets them."""
        report = pb.MetricsReport(group=self.group, pid=self.pid)
        for name, stats in self.stages.items():
            durations, stats.durations = stats.durations, []
            failures, stats.failures = stats.failures, 0
            in_flight = stats.in_flight
            if not durations and not failures and in_flight == stats._reported_in_flight:
                continue
            stats._reported_in_flight = in_flight
            report.stages.add(stage=name, count=len(durations), sum=sum(durations),
                              buckets=bin_values(durations) if durations else [], in_flight=in_flight,
                              failures=failures)
        for (src, dst, transport), stats in self.edges.items():
            if not (stats.handoffs or stats.chunks or stats.bytes or stats.latencies):
                continue
            latencies, stats.latencies = stats.latencies, []
            report.edges.add(src=src, dst=dst, transport=transport, handoffs=stats.handoffs, chunks=stats.chunks,
                             bytes=stats.bytes, latency_count=len(latencies), latency_sum=sum(latencies),
                             latency_buckets=bin_values(latencies) if latencies else [])
            stats.handoffs = stats.chunks = stats.bytes = 0
        if not report.stages and not report.edges:
            return None
        return report
