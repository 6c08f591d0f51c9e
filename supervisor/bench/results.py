"""A bench's figures: one row per load point of a topology, repeated runs combined into medians with their spread."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from stagevisor.supervisor.bench.loadgen import Summary
from stagevisor.supervisor.bench.workload import Topology

SPREAD_METRICS = ("requests_per_second", "audio_seconds_per_second", "ttfa_p50", "latency_p50")
"""The figures each row gives with their spread over repeats (min and max) and compares against the first topology."""


@dataclass
class Row:
    """One load point of one topology: medians over its repeated runs (one run: that run's figures)."""

    concurrency: int | None
    rate: float | None
    summary: Summary
    resources: dict[str, dict[str, float | None]]
    ratios: dict[str, float | None] = field(default_factory=dict)
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """Each run's SPREAD_METRICS and the machine's 1-minute load average when it started, in run order."""
    within_spread: dict[str, bool] = field(default_factory=dict)
    """Per SPREAD_METRICS figure: True when its min-max range and the first topology's overlap."""

    def spread(self) -> dict[str, list[float] | None]:
        """Min and max of each SPREAD_METRICS figure over the repeats (None where a run had no value)."""
        out: dict[str, list[float] | None] = {}
        for name in SPREAD_METRICS:
            values = [r[name] for r in self.repeats if r.get(name) is not None]
            out[name] = [min(values), max(values)] if values else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "rate": self.rate,
            **self.summary.to_json(),
            "resources": self.resources,
            "ratios": self.ratios,
            "spread": self.spread(),
            "within_spread": self.within_spread,
            "repeats": self.repeats,
        }


def figures(summary: Summary) -> dict[str, float | None]:
    """A run's SPREAD_METRICS."""
    return {
        "requests_per_second": summary.requests_per_second,
        "audio_seconds_per_second": summary.audio_seconds_per_second,
        "ttfa_p50": summary.ttfa["p50"],
        "latency_p50": summary.latency["p50"],
    }


def combine(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Rows of repeated runs of one topology (runs[i] = run i's rows, same loads) -> one row per load of medians.

    Medians of each run's figures (percentiles included: the median run's p90, not a p90 over
    pooled requests), errors summed, resources of the median run by requests/s.
    """
    if not runs:
        return []
    combined = []
    for index, first in enumerate(runs[0]):
        rows = [run[index] for run in runs if index < len(run)]
        summaries = [row.summary for row in rows]
        errors: dict[str, int] = {}
        for summary in summaries:
            for code, count in summary.errors.items():
                errors[code] = errors.get(code, 0) + count
        ordered = sorted(rows, key=lambda row: row.summary.requests_per_second)
        median_run = ordered[(len(ordered) - 1) // 2]
        summary = Summary(
            requests=sum(s.requests for s in summaries),
            wall_seconds=sum(s.wall_seconds for s in summaries),
            requests_per_second=_median([s.requests_per_second for s in summaries]) or 0.0,
            audio_seconds_per_second=_median([s.audio_seconds_per_second for s in summaries]) or 0.0,
            ttfa={q: _median([s.ttfa[q] for s in summaries]) for q in first.summary.ttfa},
            latency={q: _median([s.latency[q] for s in summaries]) for q in first.summary.latency},
            real_time_factor=_median([s.real_time_factor for s in summaries]),
            errors=errors,
            stall={q: _median([s.stall.get(q) for s in summaries]) for q in first.summary.stall},
            stalled=_median([s.stalled for s in summaries]),
        )
        repeats = [
            {**figures(row.summary), "load_average_1m": row.repeats[0].get("load_average_1m") if row.repeats else None}
            for row in rows
        ]
        combined.append(Row(first.concurrency, first.rate, summary, median_run.resources, repeats=repeats))
    return combined


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass
class TopologyResult:
    topology: Topology
    error: dict[str, Any] | None = None
    groups: dict[str, int] = field(default_factory=dict)
    """Process group -> worker pid during the measured run."""
    daemon_pid: int | None = None
    rows: list[Row] = field(default_factory=list)
    digests: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.topology.label,
            "placement": self.topology.request.options(),
            "error": self.error,
            "groups": self.groups,
            "daemon_pid": self.daemon_pid,
            "rows": [r.to_json() for r in self.rows],
        }
