"""hibari's DSP rendered in pieces: a sentence's first audio before the rest of it is computed, same samples.

`hibari.dsp.synth` turns a whole sentence's frames into its waveform at once:
a pulse train from F0, its STFT filtered by the harmonic branch, plus shaped
noise, plus a free-phase branch, then one inverse STFT (n_fft 1200, hop 300,
Hann). `SentenceRenderer` does the same arithmetic a run of frames at a time,
so the vocoder streams the first part of a sentence while computing the rest:

- the noise is the sentence's (601, 2F) part of its request's one long
  normal draw, as synth's Generator would give it sentence after sentence;
  each seed's draw is kept (`NoiseBook`), so requests with the same seed
  (every request that names none) read it rather than draw it again;
- the pulse train is made as far as the frames being computed need it
  (`PulseTrain`): its phase is a running sum over the sentence, extended in
  order in float64 exactly as `np.cumsum` adds, and every other step is
  element-wise (the reflection synth pads it with is an index map), so any
  range of it is synth's pulse train there;
- per range of frames, the same element-wise operations in the same order on
  those frames' columns, the forward and inverse FFT per frame (each frame's
  transform is independent of the others), the synthesis window: disjoint
  ranges can be computed at once, on different threads (`compute`);
- an output block of 300 samples is the sum of four windowed frame segments;
  it is added up only once all four exist, from zero in the same order as the
  package's overlap-add (frame j, j-1, j-2, j-3), then normalized by the same
  summed squared window.

Float32 addition is not associative, so the order is the contract: the unit
tests compare every sentence of a text with `dsp.synth` byte for byte.
"""

from __future__ import annotations

import collections
import functools
import itertools
import threading
from types import ModuleType
from typing import Iterator, Mapping

import numpy as np

from stagevisor.stages.hibari.voice import BINS, SPECTRAL_PARTS

FIRST_RUN_FRAMES = 16
"""Frames in a sentence's first run (0.2 s of audio): its first audio waits for little DSP."""
RUN_FRAMES = 96
"""Frames in the second run (1.2 s), rendered while the first plays."""
LATER_RUN_FRAMES = 384
"""Frames in each run after the second (4.8 s): once 1.4 s is playing, fewer, longer runs. Every run is a message
on each hop to the client, and each costs the event loops about as much whatever its length; a run this long takes
about 10 ms of DSP on one core here, far less than the audio before it takes to play."""
VOICED_HZ = 40.0
"""F0 below this is unvoiced: no pulses there (`hibari.dsp.pulses`' threshold)."""
TOP_HARMONIC_HZ = 11000.0
"""Every harmonic below this frequency is in the pulse train (`hibari.dsp.pulses`' limit)."""


def ola_norm(frames: int, window: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """1 / the summed squared window per output block (frames + overlaps, hop): the package's normalization."""
    overlaps = n_fft // hop
    squared = (window * window).reshape(overlaps, hop)
    total = np.zeros((frames + overlaps - 1, hop), np.float32)
    for k in range(overlaps):
        total[k : k + frames] += squared[k]
    return 1.0 / np.maximum(total, 1e-11)


class PulseTrain:
    """A sentence's band-limited pulse train from its F0: any range of its samples, from any thread.

    The same samples as `hibari.dsp.pulses(f0)`: each sample's instantaneous
    frequency blends the F0 of its frame and a neighbour linearly (the edges
    repeat), its phase is the running float64 sum of those frequencies
    (extended frame range by frame range, in order, under a lock, so the
    additions are those of one `np.cumsum`), and the closed-form sum of every
    harmonic below TOP_HARMONIC_HZ is taken element-wise; unvoiced samples are 0.
    """

    def __init__(self, f0: np.ndarray, sample_rate: int, hop: int) -> None:
        self.frames = f0.shape[0]
        self.hop = hop
        self.samples = self.frames * hop
        self._sample_rate = sample_rate
        self._edged = np.pad(np.asarray(f0, np.float32), 1, mode="edge")
        position = (np.arange(hop) + 0.5) / hop - 0.5  # a sample's place between frame centres
        self._after = (position % 1.0).astype(np.float32)
        self._before = (1.0 - self._after).astype(np.float32)
        # Per sample, once its frame's phase is made: frequency (floored at VOICED_HZ), voicing, phase.
        self._freq = np.empty(self.samples, np.float32)
        self._voiced = np.empty(self.samples, np.bool_)
        self._cycle = np.empty(self.samples, np.float32)
        self._phased = 0
        """Frames whose samples' frequency, voicing and phase exist."""
        self._phase = 0.0
        self._lock = threading.Lock()

    def _phase_through(self, end: int) -> None:
        """Make the frequency, voicing and phase of frames [phased, end) (end capped at the sentence's frames)."""
        with self._lock:
            start, end = self._phased, min(end, self.frames)
            if end <= start:
                return
            hop, half, edged = self.hop, self.hop // 2, self._edged
            before, after = self._before, self._after
            # Frame k's first half blends F0 of frames k-1 and k, its second half frames k and k+1 (edged is
            # shifted by 1).
            freq = np.empty((end - start, hop), np.float32)
            np.multiply(edged[start:end, None], before[:half], out=freq[:, :half])
            freq[:, :half] += edged[start + 1 : end + 1, None] * after[:half]
            np.multiply(edged[start + 1 : end + 1, None], before[half:], out=freq[:, half:])
            freq[:, half:] += edged[start + 2 : end + 2, None] * after[half:]
            freq = freq.reshape(-1)
            samples = slice(start * hop, end * hop)
            self._voiced[samples] = freq > VOICED_HZ
            np.maximum(freq, VOICED_HZ, out=freq)
            self._freq[samples] = freq
            running = np.empty(freq.shape[0] + 1, np.float64)
            running[0] = self._phase
            running[1:] = freq
            running = np.cumsum(running)
            self._phase = float(running[-1])
            phase = running[1:]
            phase *= 1.0 / self._sample_rate
            np.modf(phase, phase)
            phase *= 2 * np.pi
            self._cycle[samples] = phase.astype(np.float32)
            self._phased = end

    def samples_at(self, index: slice | np.ndarray) -> np.ndarray:
        """The pulse train at these sample indices (each in [0, samples)), making the phase as far as needed."""
        if isinstance(index, slice):
            last = index.stop - 1
        else:
            last = int(index.max())
        self._phase_through(last // self.hop + 1)
        freq, cycle = self._freq[index], self._cycle[index]
        harmonics = np.floor(TOP_HARMONIC_HZ / freq)
        harmonics += 0.5
        denominator = np.sin(cycle * 0.5)
        denominator *= 2
        near_zero = np.abs(denominator) <= 2e-3  # the sum's limit there is the harmonic count
        pulses = np.sin(harmonics * cycle)
        denominator[near_zero] = 1
        pulses /= denominator
        pulses[near_zero] = harmonics[near_zero]
        pulses -= 0.5
        pulses[~self._voiced[index]] = 0
        return pulses

    def padded(self, start: int, stop: int, pad: int) -> np.ndarray:
        """Samples [start, stop) of the train as `np.pad(train, pad, mode="reflect")` has them (index 0 = the
        first of the `pad` reflected samples)."""
        top = self.samples
        low, high = max(start, pad), min(stop, top + pad)  # the part inside the train: read as a slice
        if low >= high:
            return self._reflected(np.arange(start - pad, stop - pad))
        parts = [self.samples_at(slice(low - pad, high - pad))]
        if start < low:
            parts.insert(0, self._reflected(np.arange(start - pad, low - pad)))
        if high < stop:
            parts.append(self._reflected(np.arange(high - pad, stop - pad)))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _reflected(self, index: np.ndarray) -> np.ndarray:
        """The train at indices outside it, reflected at both ends (again and again where the pad is longer)."""
        top = self.samples
        period = 2 * (top - 1)
        if period:
            index = np.abs(index) % period
            index = np.where(index >= top, period - index, index)
        else:
            index = np.zeros_like(index)
        return self.samples_at(index)


def draw_noise(rng: np.random.Generator, bins: int, frames: int) -> np.ndarray:
    """A sentence's noise as synth draws it: one (bins, 2 frames) float32 normal draw, viewed as (bins, frames)
    complex64."""
    return rng.standard_normal((bins, 2 * frames), dtype=np.float32).view(np.complex64)


class SeedNoise:
    """One seed's normal draw, kept: every request with this seed reads its noise here instead of drawing it.

    A normal draw of n values then one of m gives the values and Generator state
    of one draw of n + m, so a request's noise, sentence after sentence, is the
    seed's one long draw read in order. It is drawn as far as a request has
    needed (`fill`, a block at a time under a lock, from any thread) and kept
    up to `limit` values; past them a request draws on from a Generator left
    exactly where the kept values end (`past_limit`).
    """

    BLOCK_VALUES = 16 * 2 * BINS
    """Values drawn under the lock at a time (16 frames of 601 bins): a reader waits for at most one block."""

    def __init__(self, seed: int, limit: int) -> None:
        self.seed = seed
        self.limit = limit
        self._rng = np.random.default_rng(seed)
        self._values = np.empty(limit, np.float32)  # its pages are touched as they are filled
        self.filled = 0
        self._lock = threading.Lock()

    def fill(self, end: int) -> None:
        """Make the draw's first `end` values exist (at most `limit`)."""
        end = min(end, self.limit)
        while self.filled < end:
            with self._lock:
                start = self.filled
                if start >= end:
                    return
                stop = min(end, start + self.BLOCK_VALUES)
                self._rng.standard_normal(dtype=np.float32, out=self._values[start:stop])
                self.filled = stop

    def read(self, start: int, end: int) -> np.ndarray:
        """The draw's values [start, end) (end at most `limit`), read-only: a view, not a copy."""
        self.fill(end)
        values = self._values[start:end]
        values.flags.writeable = False
        return values

    def past_limit(self) -> np.random.Generator:
        """A new Generator in the state the seed's draw is in after its `limit` values."""
        self.fill(self.limit)
        rng = np.random.default_rng()
        with self._lock:
            rng.bit_generator.state = self._rng.bit_generator.state
        return rng


class RequestNoise:
    """One request's noise: its seed's draw read in order, a sentence at a time, the values one Generator would
    give (`take`); `ahead` draws what the next sentence will need before its frames exist."""

    def __init__(self, seed: SeedNoise, bins: int) -> None:
        self._seed = seed
        self.bins = bins
        self._used = 0
        """Values the request's sentences have taken."""
        self._rng: np.random.Generator | None = None
        """Past the seed's limit: the request's own Generator, drawing on where the kept values end."""

    def ahead(self, frames: int) -> None:
        """Draw the noise of the next `frames` frames now (as far as the seed's draw is kept), so `take` finds it."""
        self._seed.fill(self._used + self.bins * 2 * frames)

    def take(self, frames: int) -> np.ndarray:
        """The next sentence's (bins, frames) complex64 noise: the values synth's draw of it would give."""
        start, end = self._used, self._used + self.bins * 2 * frames
        limit = self._seed.limit
        if end <= limit:
            values = self._seed.read(start, end)
        else:
            if self._rng is None:
                self._rng = self._seed.past_limit()
            rest = self._rng.standard_normal(end - max(start, limit), dtype=np.float32)
            values = np.concatenate([self._seed.read(start, limit), rest]) if start < limit else rest
        self._used = end
        return values.reshape(self.bins, 2 * frames).view(np.complex64)


class NoiseBook:
    """The draws of the seeds requests used last (`seeds` of them, least recently used dropped), each kept up to
    `limit` values: requests without a seed all share the default seed's, so their noise costs a read, not a
    draw. A request keeps its seed's draw while it runs, dropped from the book or not. Use from one thread (the
    event loop); the draws themselves fill from any."""

    def __init__(self, bins: int, seeds: int, limit_frames: int) -> None:
        self.bins = bins
        self.seeds = seeds
        self.limit = bins * 2 * limit_frames
        self._kept: collections.OrderedDict[int, SeedNoise] = collections.OrderedDict()

    def request(self, seed: int) -> RequestNoise:
        """A new request's noise for `seed`, from the start of the seed's draw."""
        kept = self._kept.pop(seed, None) or SeedNoise(seed, self.limit)
        self._kept[seed] = kept
        while len(self._kept) > self.seeds:
            self._kept.popitem(last=False)
        return RequestNoise(kept, self.bins)

    def kept_seeds(self) -> list[int]:
        """The seeds whose draws are kept, least recently used first."""
        return list(self._kept)


class SentenceRenderer:
    """One sentence's frames -> its waveform, a run of frames at a time (`runs()` yields the audio in order)."""

    def __init__(self, frames: Mapping[str, np.ndarray], noise: np.ndarray) -> None:
        """`noise`: the sentence's (bins, F) complex64 noise, as synth draws it (`draw_noise`, `RequestNoise.take`)."""
        from hibari import dsp

        self._dsp: ModuleType = dsp
        self.parts = {name: np.asarray(frames[name]) for name in SPECTRAL_PARTS}
        f0 = np.asarray(frames["f0"])
        self.frames = f0.shape[0]
        self.bins = self.parts["lh"].shape[0]
        if noise.shape != (self.bins, self.frames) or noise.dtype != np.complex64:
            raise ValueError(
                f"the noise of {self.frames} frames must be ({self.bins}, {self.frames}) complex64, "
                f"got {noise.shape} {noise.dtype}"
            )
        self.hop = dsp.HOP
        self.overlaps = dsp.N_FFT // dsp.HOP
        # The pulse train, made as the frames being computed need it (synth pads it with n_fft / 2 samples
        # reflected at each end; frame j's analysis window spans padded samples [j hop, j hop + n_fft)).
        self._pulses = PulseTrain(f0, dsp.SR, self.hop)
        self._noise = noise
        self._segments = np.empty((self.frames, self.overlaps, self.hop), np.float32)
        self._norm = ola_norm(self.frames, dsp.WIN, dsp.N_FFT, self.hop)
        self._emitted = 0  # output blocks already returned

    def ranges(
        self, first: int = FIRST_RUN_FRAMES, second: int = RUN_FRAMES, later: int = LATER_RUN_FRAMES
    ) -> list[tuple[int, int]]:
        """The frame ranges of the sentence's runs: `first` frames, then `second`, then `later` at a time; a run
        after the first that would leave fewer than `later // 4` frames takes them too (no tiny last run)."""
        sizes = itertools.chain((first, second), itertools.repeat(later))
        found: list[tuple[int, int]] = []
        start = 0
        while start < self.frames:
            end = min(self.frames, start + next(sizes))
            if found and self.frames - end < later // 4:
                end = self.frames
            found.append((start, end))
            start = end
        return found

    def compute(self, start: int, end: int) -> None:
        """Each windowed segment of frames [start, end). Calls for disjoint ranges may run at once (threads)."""
        dsp, parts = self._dsp, {name: part[:, start:end] for name, part in self.parts.items()}
        source = self._pulses.padded(start * self.hop, (end - 1) * self.hop + dsp.N_FFT, dsp.N_FFT // 2)
        windows = np.lib.stride_tricks.sliding_window_view(source, dsp.N_FFT)[:: self.hop]
        spec = np.ascontiguousarray(dsp.rfft(windows * dsp.WIN_SRC, 1).T)
        rot = np.empty(spec.shape, np.complex64)
        c = np.tanh(parts["theta"])
        c *= np.pi
        np.cos(c, out=rot.real)
        np.sin(c, out=rot.imag)
        rot *= dsp.ex(parts["lh"])
        spec *= rot
        spec += self._noise[:, start:end] * dsp.ex(parts["ln"])
        np.cos(parts["phi"], out=rot.real)
        np.sin(parts["phi"], out=rot.imag)
        rot *= dsp.ex(parts["lr"])
        spec += rot
        segments = dsp.irfft(spec.T, dsp.N_FFT, 1)
        segments *= dsp.WIN
        self._segments[start:end] = segments.reshape(end - start, self.overlaps, self.hop)

    def emit(self, end: int) -> np.ndarray | None:
        """The audio not yet emitted that is complete once every frame below `end` is computed (None: none yet).

        Output sample s lies in overlap-add block s // hop + 2 (the first n_fft / 2 samples are the
        padding synth drops); block j is complete once frames up to j are computed. Call in order, one at a time.
        """
        half_blocks = self.overlaps // 2
        ready = self.frames + half_blocks if end == self.frames else end
        if self._emitted == 0:
            self._blocks(half_blocks)  # the n_fft / 2 samples of padding synth drops
        return self._blocks(ready).reshape(-1) if ready > self._emitted else None

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

    def runs(
        self, first: int = FIRST_RUN_FRAMES, second: int = RUN_FRAMES, later: int = LATER_RUN_FRAMES
    ) -> Iterator[np.ndarray]:
        """Yield the sentence's waveform in order, one float32 array per run of `ranges()` (the last closes it)."""
        for start, end in self.ranges(first, second, later):
            self.compute(start, end)
            audio = self.emit(end)
            if audio is not None:
                yield audio


@functools.lru_cache(maxsize=1)
def warm_up() -> int:
    """Render a silent sentence once (a first run and a later one), so numpy's and scipy.fft's first-call setup
    (FFT plans, buffers) happens before any request; once per process. Returns the samples made."""
    frames = FIRST_RUN_FRAMES + RUN_FRAMES
    parts = {name: np.zeros((BINS, frames), np.float32) for name in SPECTRAL_PARTS}
    noise = draw_noise(np.random.default_rng(0), BINS, frames)
    renderer = SentenceRenderer({**parts, "f0": np.full(frames, 120.0, np.float32)}, noise)
    return sum(run.shape[0] for run in renderer.runs())
