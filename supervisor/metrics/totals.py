"""The worker-reported totals of a daemon's metrics: per stage, per (stage, group) series and per edge, cumulative.

Workers report deltas (MetricsReport frames on the data plane); DaemonMetrics
(registry.py) adds them up here, so they survive worker restarts, and the
collector (collector.py) exports them at scrape time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS


def add_counts(into: list[int], counts: Iterable[int]) -> None:
    """Add a report's bucket counts into the totals' own, bucket by bucket."""
    for index, count in enumerate(counts):
        into[index] += count


@dataclass
class SeriesTotals:
    """A stage's finished and failed calls and timed-call histogram, cumulative: over all its groups (a stage's own
    totals), or in one group (the series `{stage, group}`: an apply that moves the stage starts its new group's)."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    count: int = 0
    sum: float = 0.0
    calls: int = 0
    failures: int = 0

    def add(self, item: Any) -> None:
        """Add one stage item of a worker's MetricsReport (deltas)."""
        self.calls += item.calls
        if item.count:
            add_counts(self.buckets, item.buckets)
            self.count += item.count
            self.sum += item.sum
        self.failures += item.failures


IN_FLIGHT_KEPT = 1024
"""Entries of StageTotals.in_flight kept per stage: far more workers than run a stage at once."""


@dataclass
class StageTotals(SeriesTotals):
    in_flight: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(reporting worker's name, its pid) -> (pid, calls running) as last reported. By name and pid: while an apply
    switches, the old topology's worker and the new one share a name, and the old one's last report as it stops
    must not stand for the new one's (past IN_FLIGHT_KEPT, the entry reported longest ago goes: a worker long gone)."""
    history: deque[tuple[float, list[int], int]] = field(default_factory=deque)
    """(monotonic time, cumulative buckets, cumulative calls) after each report, trimmed to the window."""


@dataclass
class EdgeTotals:
    handoffs: int = 0
    chunks: int = 0
    bytes: int = 0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    latency_count: int = 0
    latency_sum: float = 0.0
