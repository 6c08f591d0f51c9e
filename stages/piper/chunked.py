"""Chunked decoding of a Piper latent: windows at fixed absolute frame offsets, each with real context on both
sides, so the audio depends only on the latent, never on how it was chunked on the way. Pure numpy bookkeeping;
the decode itself is the caller's (`Voice.decode`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

LATENT_CHANNELS = 192
HOP_SAMPLES = 256
# Frames of real context on each side of a decode window. The decoder's
# receptive field ends at about 11 frames: with 11 or more the chunked decode
# gives a whole-latent decode's audio to the bit (with the convolutions run as
# 2-D ones, stages/piper/conv2d.py, whose kernels sum every output in the same order
# whatever the window's width; the exported 1-D graph leaves 7e-7 of float
# noise at the seams), with 9 it is 6e-4 off and with 8 2e-3 (audible at the
# seams). 12 keeps a frame in hand; every frame of context is decoded twice at
# each seam.
CONTEXT_FRAMES = 12
# The streaming schedule: output frames per decode window, the last entry
# repeating. Two windows of a request decode at once (stages/piper/executors.py), so the
# schedule trades first audio, compute and balance between the two threads:
# - the first window is short (~0.37 s of audio), so first audio comes early;
# - later windows are short enough to spread a sentence (80-100 characters,
#   430-510 frames) over both threads while the flow is still computing: in
#   three runs of bench_voice.py (its 679-frame sentence, 7 repetitions each)
#   two threads decoded it in 0.55x-0.56x a whole decode's wall time, against
#   0.65x-0.70x with windows of 224 then 384 frames. A seam decodes
#   2 * CONTEXT_FRAMES frames twice, but the CPU of the two schedules was
#   within their spread (1.05x-1.13x a whole decode's, against 1.04x-1.16x):
#   a window's CPU per frame grows with its width (caches). Under load the
#   short windows also free a decode thread for the next request's first
#   window sooner.
# The windows never change the audio (above), so the schedule follows these
# costs alone. The audio already delivered buys the time to decode the next
# window: the decoder runs many times faster than real time, so the stream
# never falls behind once it has started on an unloaded machine.
WINDOW_SCHEDULE = (32, 128, 160)


@dataclass(frozen=True)
class DecodeJob:
    """One window ready to decode: its latent frames with context, and which samples of the result to keep.

    Windows are independent of each other, so jobs may run concurrently (one
    thread each: onnxruntime releases the GIL) without changing a byte.
    """

    latent: np.ndarray
    keep: slice
    start: int = 0
    """The window's first output frame, counted from the start of the latent."""

    def run(self, decode: Any) -> np.ndarray:
        return decode(self.latent)[self.keep]


class ChunkedDecoder:
    """Decodes a latent that arrives in pieces, window by window, as soon as context allows.

    Window k covers the output frames after window k-1 and has `schedule[k]`
    frames, the schedule's last entry repeating (see `window_size`).
    A window [s, e) is decoded from the input frames [s - C, e + C) clipped to
    the latent, so it is ready once C frames past its end have arrived (or the
    latent has ended). The windows sit at absolute offsets: the audio is the
    same however the latent was split into pieces. Pure bookkeeping plus
    `decode` calls; not async. `take()` hands out the ready windows as
    DecodeJobs for concurrent decoding.
    """

    def __init__(
        self,
        decode: Any,
        schedule: tuple[int, ...] = WINDOW_SCHEDULE,
        context: int = CONTEXT_FRAMES,
    ) -> None:
        if not schedule or min(schedule) < 1 or context < 0:
            raise ValueError("the schedule needs at least one window, every window >= 1 frame, and context >= 0")
        self._decode = decode
        self._schedule = tuple(schedule)
        self._context = context
        self._latent = np.zeros((LATENT_CHANNELS, 0), dtype=np.float32)
        self._pending: list[np.ndarray] = []  # chunks added since _latent was last joined, in order
        self._offset = 0  # absolute frame index of self._latent[:, 0]
        self._decoded = 0  # output frames already handed out for decoding
        self._windows = 0  # windows handed out so far
        self.frames = 0

    def window_size(self, index: int) -> int:
        """Output frames of window `index` (0-based): the schedule's entry, its last one past its end."""
        return self._schedule[min(index, len(self._schedule) - 1)]

    def push(self, latent: np.ndarray) -> list[np.ndarray]:
        """Add frames (192, n); return audio for every window that became ready."""
        self.add(latent)
        return self.decode_ready()

    def add(self, latent: np.ndarray) -> None:
        """Add frames (192, n) without decoding: cheap bookkeeping, fine on an event loop."""
        latent = np.asarray(latent, dtype=np.float32)
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise ValueError(f"latent chunk must have shape ({LATENT_CHANNELS}, frames), got {latent.shape}")
        if latent.shape[1]:
            # Kept as a copy (an in-process engine may reuse its buffer once its chunk is handed over)
            # and joined only when a window is cut (`take`), not once per chunk.
            self._pending.append(latent.copy())
            self.frames += latent.shape[1]

    def ready(self) -> bool:
        """True when the next window and its right context have arrived (decode_ready has work)."""
        return self._decoded < self.frames and self._next_window_end() + self._context <= self.frames

    def _next_window_end(self) -> int:
        return self._decoded + self.window_size(self._windows)

    def decode_ready(self) -> list[np.ndarray]:
        """Audio for every window whose frames and right context have arrived (decoded here, in order)."""
        return [job.run(self._decode) for job in self.take(final=False)]

    def finish(self) -> list[np.ndarray]:
        """The latent has ended: decode what remains."""
        return [job.run(self._decode) for job in self.take(final=True)]

    def take(self, final: bool) -> list[DecodeJob]:
        """The windows ready now (all that remain when `final`), in order; each is handed out once."""
        jobs = []
        if self._pending and (final or self.ready()):
            self._latent = np.concatenate([self._latent, *self._pending], axis=1)
            self._pending.clear()
        while self._decoded < self.frames:
            if not final and not self.ready():
                break
            start = self._decoded
            end = min(self._next_window_end(), self.frames)
            lo = max(0, start - self._context)
            hi = min(self.frames, end + self._context)
            latent = np.ascontiguousarray(self._latent[:, lo - self._offset : hi - self._offset])
            jobs.append(DecodeJob(latent, slice((start - lo) * HOP_SAMPLES, (end - lo) * HOP_SAMPLES), start))
            self._decoded = end
            self._windows += 1
            self._trim()
        return jobs

    def _trim(self) -> None:
        # Keep only the left context the next window needs, so memory stays
        # bounded by a window plus context however long the sentence.
        keep_from = max(0, self._decoded - self._context)
        if keep_from > self._offset:
            self._latent = self._latent[:, keep_from - self._offset :]
            self._offset = keep_from
