"""Recorder: what one worker measures of its stages and incoming handoffs, reported to the daemon as deltas.

The in-process hot path (a local `next` stage called directly, see
StageCalls.run in dataplane/stage_calls.py) does no metric work per hop: what a hop would count is
derived when a report is taken. Per chain of direct calls the runtime bumps one
integer (`StageStats.starts`) and keeps the chain's Invocation in a live set;
a call that raises or is cancelled bumps another (raised = failures +
cancelled). A report then works out, exactly:

    entered(S)  = starts(S) + sum of handoffs(P -> S) over direct edges into S
    handoffs(P -> S) = entered(P) - running(P) - raised(P)
    calls(S)    = entered(S) - running(S)

where running(S) counts live chains whose current stage is S. Stage durations
are timed by reading the clock once per stage call, but only on chains the
Recorder picks (`timing()`): every chain while a worker starts fewer than
TIMED_CHAINS_PER_REPORT per report interval, above that one chain in N per
first stage (N set at each report from the last interval's rate), so timing
costs a bounded amount however fast the stages run. Requests whose
timings someone reads (`synthesize --timings`, OTLP export) are always timed.
Handoffs that start a task (fan-out, streams, cross-process) are counted as
they happen, on objects bound once per edge. Durations are binned in one batch
per report.

Every REPORT_INTERVAL the worker's endpoint sends `collect()` — what changed since
the previous report — to the daemon, which accumulates it; so a worker that
restarts starts from zero without resetting or doubling the daemon's counters.
The event loop is single-threaded, so nothing here takes a lock.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Mapping

import numpy as np

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS

REPORT_INTERVAL = 0.5
"""Seconds between a worker's metric reports."""
TIMED_CHAINS_PER_REPORT = 500
"""Chains of stage calls timed per report interval at most (1000 a second), unless their timings are read."""
IN_PROCESS, GRPC, SHARED_MEMORY = "in_process", "grpc", "shared_memory"
_BOUNDS = np.asarray(LATENCY_BOUNDS)


def bin_batch(values: list[float]) -> list[int]:
    """Per-bucket counts of `values` on LATENCY_BOUNDS (`le` semantics, last bucket +Inf), in one numpy pass."""
    index = np.searchsorted(_BOUNDS, np.asarray(values, dtype=float), side="left")
    return np.bincount(index, minlength=len(LATENCY_BOUNDS) + 1).tolist()


class StageStats:
    """One stage's counts: cumulative chain starts and raised calls, and durations timed since the last report."""

    __slots__ = (
        "durations",
        "starts",
        "next_timed",
        "stride",
        "failures",
        "cancelled",
        "_calls",
        "_failures",
        "_in_flight",
        "_starts",
    )

    def __init__(self) -> None:
        self.durations: list[float] = []
        self.starts = 0
        """Chains (tasks) that began with this stage; cumulative."""
        self.next_timed = 1
        """The chain start (value of `starts`) from which the next chain starting here may be timed."""
        self.stride = 1
        """Time one chain in `stride` starting here (set at each report from the last interval's rate)."""
        self.failures = 0
        """Calls that raised an error; cumulative."""
        self.cancelled = 0
        """Calls cancelled (the request was cancelled or failed elsewhere); cumulative."""
        self._calls = 0  # finished calls reported so far
        self._failures = 0  # failures reported so far
        self._starts = 0  # starts as of the last report
        self._in_flight = 0  # as last reported


class EdgeStats:
    """Handoffs received over one edge by one transport since the last report."""

    __slots__ = ("handoffs", "chunks", "bytes", "latencies")

    def __init__(self) -> None:
        self.handoffs = 0
        self.chunks = 0
        self.bytes = 0
        self.latencies: list[float] = []


def _no_running() -> Mapping[str, int]:
    return {}


class Recorder:
    """The metrics of one worker process; the runtime binds stage and edge stats once and updates them."""

    def __init__(self, group: str, pid: int | None = None, *, timed_per_report: int = TIMED_CHAINS_PER_REPORT) -> None:
        self.group = group
        self.timed_per_report = timed_per_report
        self.pid = os.getpid() if pid is None else pid
        self.stages: dict[str, StageStats] = {}
        self.edges: dict[tuple[str, str, str], EdgeStats] = {}
        self._direct: dict[str, str] = {}
        self._running: Callable[[], Mapping[str, int]] = _no_running
        self._handed: dict[str, int] = {}  # direct handoffs out of a stage reported so far
        self._budget = timed_per_report

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

    def bind_chains(self, direct: Mapping[str, str], running: Callable[[], Mapping[str, int]]) -> None:
        """Tell the recorder which stage each stage calls directly (src -> dst), and how to count the
        stage calls running now (stage -> count); both are read only when a report is taken."""
        self._direct = dict(direct)
        self._running = running
        for src, dst in self._direct.items():
            self.stage(src), self.stage(dst), self.edge(src, dst, IN_PROCESS)
            self._handed.setdefault(src, 0)

    def timing(self, first: StageStats) -> bool:
        """Whether to time the chain starting now at a stage whose `starts` reached its `next_timed`
        (the runtime asks only then, so a chain that is not timed costs one comparison)."""
        if self._budget <= 0:  # spent until the next report: ask again only a while later
            first.next_timed = first.starts + max(first.stride, 64)
            return False
        first.next_timed = first.starts + first.stride
        self._budget -= 1
        return True

    def _fold_chains(self, running: Mapping[str, int]) -> dict[str, int]:
        """Finished calls per stage (cumulative), with the direct handoffs they imply added to the edges."""
        into: dict[str, list[str]] = {}
        for src, dst in self._direct.items():
            into.setdefault(dst, []).append(src)
        entered: dict[str, int] = {}

        def enter(name: str, seen: frozenset = frozenset()) -> int:
            if name not in entered:
                if name in seen:  # a cycle of direct calls cannot happen in a valid plan
                    return 0
                stats = self.stages[name]
                total = stats.starts
                for src in into.get(name, ()):
                    total += handed(src, seen | {name})
                entered[name] = total
            return entered[name]

        def handed(src: str, seen: frozenset) -> int:
            stats = self.stages[src]
            return enter(src, seen) - running.get(src, 0) - stats.failures - stats.cancelled

        calls = {name: enter(name) - running.get(name, 0) for name in self.stages}
        for src, dst in self._direct.items():
            total = handed(src, frozenset())
            self.edges[(src, dst, IN_PROCESS)].handoffs += total - self._handed[src]
            self._handed[src] = total
        return calls

    def collect(self) -> pb.MetricsReport | None:
        """The deltas since the previous call (None when nothing changed); resets them."""
        running = self._running()
        calls = self._fold_chains(running)
        # Share the next interval's timing budget among the stages that started chains in this one,
        # each timing one chain in `stride`, evenly spread over its own rate.
        started = {name: stats.starts - stats._starts for name, stats in self.stages.items()}
        share = max(1, self.timed_per_report // max(1, sum(1 for count in started.values() if count)))
        for name, stats in self.stages.items():
            stats.stride = max(1, math.ceil(started[name] / share))
            stats.next_timed = min(stats.next_timed, stats.starts + 1)  # a spent budget is refilled now
            stats._starts = stats.starts
        self._budget = self.timed_per_report
        report = pb.MetricsReport(group=self.group, pid=self.pid)
        for name, stats in self.stages.items():
            durations, stats.durations = stats.durations, []
            in_flight = running.get(name, 0)
            new_calls, failures = calls[name] - stats._calls, stats.failures - stats._failures
            if not durations and not new_calls and not failures and in_flight == stats._in_flight:
                continue
            stats._calls, stats._failures, stats._in_flight = calls[name], stats.failures, in_flight
            report.stages.add(
                stage=name,
                count=len(durations),
                sum=sum(durations),
                buckets=bin_batch(durations) if durations else [],
                in_flight=in_flight,
                failures=failures,
                calls=new_calls,
            )
        for (src, dst, transport), edge_stats in self.edges.items():
            if not (edge_stats.handoffs or edge_stats.chunks or edge_stats.bytes or edge_stats.latencies):
                continue
            latencies, edge_stats.latencies = edge_stats.latencies, []
            report.edges.add(
                src=src,
                dst=dst,
                transport=transport,
                handoffs=edge_stats.handoffs,
                chunks=edge_stats.chunks,
                bytes=edge_stats.bytes,
                latency_count=len(latencies),
                latency_sum=sum(latencies),
                latency_buckets=bin_batch(latencies) if latencies else [],
            )
            edge_stats.handoffs = edge_stats.chunks = edge_stats.bytes = 0
        if not report.stages and not report.edges:
            return None
        return report
