"""Histogram bucket bounds shared by workers and the daemon, and quantiles from bucket counts.

A leaf module: stdlib only, so the worker's hot path and the CLI import it cheaply.
Workers bin durations on these bounds and report per-bucket counts; the daemon
adds them up and exports cumulative Prometheus histograms on the same bounds.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

LATENCY_BOUNDS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Seconds; stage processing, handoff latency, request latency. One more bucket holds +Inf."""

RTF_BOUNDS: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
"""Real-time factor (synthesis seconds per audio second): below 1 is faster than real time."""


def bin_values(values: Sequence[float], bounds: Sequence[float] = LATENCY_BOUNDS) -> list[int]:
    """Per-bucket counts (not cumulative) of `values`; the last bucket is +Inf. `le` semantics."""
    counts = [0] * (len(bounds) + 1)
    for value in values:
        counts[bisect_left(bounds, value)] += 1
    return counts


def quantile(q: float, counts: Sequence[int], bounds: Sequence[float] = LATENCY_BOUNDS) -> float | None:
    """The q-quantile of per-bucket counts, interpolated linearly inside its bucket (as
    Prometheus' histogram_quantile does); None without observations. A quantile in the
    +Inf bucket is reported as the highest finite bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            if index >= len(bounds):
                return bounds[-1]
            lower = bounds[index - 1] if index > 0 else 0.0
            upper = bounds[index]
            return lower + (upper - lower) * ((rank - seen) / count)
        seen += count
    return bounds[-1]
