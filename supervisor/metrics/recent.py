"""The recent finished requests' first audio and playback stall, as p90s over a sliding window (autoscaling)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

MAX_SAMPLES = 100_000
"""The most requests kept, whatever the rate: memory stays bounded."""
HORIZON_SECONDS = 600.0
"""The longest window a group may scale on (AutoscaleConfig.window_seconds); older requests are dropped."""


@dataclass(frozen=True)
class RecentFigures:
    """What the requests that finished in the window measured: their count and p90s (None with no request)."""

    requests: int
    first_audio_p90: float | None
    stall_p90: float | None


def p90(values: list[float]) -> float | None:
    """The nearest-rank 90th percentile: the smallest value at least 90% of the values are at or below."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


class RecentRequests:
    """(finish time, first audio, stall) of each successful request, oldest first, bounded in count."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=MAX_SAMPLES)

    def __len__(self) -> int:
        """How many requests are held."""
        return len(self._samples)

    def add(self, now: float, first_audio: float, stall: float) -> None:
        # Dropped here too, not only when the autoscaler reads: without autoscaling nobody reads, and a busy
        # daemon would hold MAX_SAMPLES (about 13 MB) of requests no window reaches.
        self._forget_before(now)
        self._samples.append((now, first_audio, stall))

    def figures(self, now: float, window: float) -> RecentFigures:
        """The requests that finished in (now - window, now]."""
        since = now - window
        self._forget_before(now)
        recent = [(audio, stall) for when, audio, stall in self._samples if since < when <= now]
        return RecentFigures(len(recent), p90([a for a, _ in recent]), p90([s for _, s in recent]))

    def _forget_before(self, now: float) -> None:
        """Drop the requests older than HORIZON_SECONDS at `now`: no window reaches them."""
        while self._samples and self._samples[0][0] <= now - HORIZON_SECONDS:
            self._samples.popleft()
