"""hibari's DSP rendered in pieces: a sentence's first audio before the rest of it is computed, same samples.

`hibari.dsp.synth` turns a whole sentence's frames into its waveform at once:
a pulse train from F0, its STFT filtered by the harmonic branch, plus shaped
noise, plus a free-phase branch, then one inverse STFT (n_fft 1200, hop 300,
Hann). `SentenceRenderer` does the same arithmetic a run of frames at a time,
so the vocoder streams the first part of a sentence while computing the rest:

- what spans the whole sentence is computed first, as synth computes it: the
  pulse train (its phase is a running sum over the sentence) and the noise
  draw (one (601, 2F) normal draw, so the Generator advances exactly as the
  package's does);
- per run of frames, the same element-wise operations in the same order on
  those frames' columns, the forward and inverse FFT per frame (each frame's
  transform is independent of the others), the synthesis window;
- an output block of 300 samples is the sum of four windowed frame segments;
  it is added up only once all four exist, from zero in the same order as the
  package's overlap-add (frame j, j-1, j-2, j-3), then normalized by the same
  summed squared window.

Float32 addition is not associative, so the order is the contract: the unit
tests compare every sentence of a text with `dsp.synth` byte for byte.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from stagevisor.stages.hibari.voice import SPECTRAL_PARTS

FIRST_RUN_FRAMES = 16
"""Frames in a sentence's first run (0.2 s of audio): its first audio waits for little DSP."""
RUN_FRAMES = 96
"""Frames in each later run (1.2 s): fewer, larger numpy calls once audio is playing."""


def ola_norm(frames: int, window: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """1 / the summed squared window per output block (frames + overlaps, hop): the package's normalization."""
    overlaps = n_fft // hop
    squared = (window * window).reshape(overlaps, hop)
    total = np.zeros((frames + overlaps - 1, hop), np.float32)
    for k in range(overlaps):
        total[k : k + frames] += squared[k]
    return 1.0 / np.maximum(total, 1e-11)


class SentenceRenderer:
    """One sentence's frames -> its waveform, a run of frames at a time (`runs()` yields the audio in order)."""

    def __init__(self, frames: Mapping[str, np.ndarray], rng: np.random.Generator) -> None:
        from hibari import dsp

        self._dsp = dsp
        self.parts = {name: np.asarray(frames[name]) for name in SPECTRAL_PARTS}
        f0 = np.asarray(frames["f0"])
        self.frames = f0.shape[0]
        self.bins = self.parts["lh"].shape[0]
        self.hop = dsp.HOP
        self.overlaps = dsp.N_FFT // dsp.HOP
        # Whole-sentence pieces, in synth's order: the pulse train, then the noise draw.
        padded = np.pad(dsp.pulses(f0), dsp.N_FFT // 2, mode="reflect")
        self._windows = np.lib.stride_tricks.sliding_window_view(padded, dsp.N_FFT)[:: self.hop][: self.frames]
        self._noise = rng.standard_normal((self.bins, 2 * self.frames), dtype=np.float32).view(np.complex64)
        self._segments = np.empty((self.frames, self.overlaps, self.hop), np.float32)
        self._norm = ola_norm(self.frames, dsp.WIN, dsp.N_FFT, self.hop)
        self._computed = 0  # frames whose windowed segments exist
        self._emitted = 0  # output blocks already returned

    def _compute(self, start: int, end: int) -> None:
        dsp, parts = self._dsp, {name: part[:, start:end] for name, part in self.parts.items()}
        spec = np.ascontiguousarray(dsp.rfft(self._windows[start:end] * dsp.WIN_SRC, 1).T)
        rot = np.empty(spec.shape, np.complex64)
        c = np.tanh(parts["theta"])
        c *= np.pi
        np.cos(c, out=rot.real)
        np.sin(c, out=rot.imag)
        rot *= dsp.ex(parts["lh"])
        spec *= rot
        z = self._noise[:, start:end].copy()
        z *= dsp.ex(parts["ln"])
        spec += z
        np.cos(parts["phi"], out=rot.real)
        np.sin(parts["phi"], out=rot.imag)
        rot *= dsp.ex(parts["lr"])
        spec += rot
        segments = dsp.irfft(spec.T, dsp.N_FFT, 1)
        segments *= dsp.WIN
        self._segments[start:end] = segments.reshape(end - start, self.overlaps, self.hop)
        self._computed = end

    def _blocks(self, end: int) -> np.ndarray:
        """Output blocks [emitted, end) of the overlap-add, each summed from zero in the package's order."""
        start = self._emitted
        y = np.zeros((end - start, self.hop), np.float32)
        for k in range(self.overlaps):
            # Block j gets frame j - k's k-th segment; only frames that exist contribute.
            low, high = max(start, k), min(end, self.frames + k)
            if low < high:
                y[low - start : high - start] += self._segments[low - k : high - k, k]
        y *= self._norm[start:end]
        self._emitted = end
        return y

    def runs(self, first: int = FIRST_RUN_FRAMES, rest: int = RUN_FRAMES) -> Iterator[np.ndarray]:
        """Yield the sentence's waveform in order, one float32 array per run of frames (the last one closes it).

        Output sample s lies in overlap-add block s // hop + 2 (the first n_fft / 2 samples are the
        padding synth drops); block j is complete once frames up to j are computed.
        """
        half_blocks = self.overlaps // 2
        size = first
        while self._computed < self.frames:
            self._compute(self._computed, min(self.frames, self._computed + size))
            size = rest
            ready = self.frames + half_blocks if self._computed == self.frames else self._computed
            if self._emitted == 0:
                self._blocks(half_blocks)  # the n_fft / 2 samples of padding synth drops
            if ready > self._emitted:
                yield self._blocks(ready).reshape(-1)
