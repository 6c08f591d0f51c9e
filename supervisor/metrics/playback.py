"""A client playing a stream as it arrives: how long it would have paused waiting for audio.

The measure of a stream that fell behind real time once it had started: the
load generator reports it per request (`stagevisor bench`,
tests/benchmarks/bench_piper.py) and the daemon exports it as the histogram
`stagevisor_playback_stall_seconds`.
"""

from __future__ import annotations


class Playback:
    """A client playing a stream as it arrives: playback starts with the first chunk and pauses when it runs dry.

    `stall` is the total time it paused: 0 for a stream that stayed ahead of
    real time once it started. Feed it each chunk's arrival time (seconds,
    any monotonic clock) and audio duration, in order.
    """

    __slots__ = ("stall", "_plays_until")

    def __init__(self) -> None:
        self.stall = 0.0
        self._plays_until: float | None = None  # when the audio received so far ends playing

    def arrived(self, at: float, seconds: float) -> None:
        if self._plays_until is None or at > self._plays_until:
            if self._plays_until is not None:
                self.stall += at - self._plays_until
            self._plays_until = at
        self._plays_until += seconds
