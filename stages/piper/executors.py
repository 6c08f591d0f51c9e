"""The demo model's executors: preprocessing -> tts_engine ~> vocoder on the embedded voice.

- `preprocessing` validates the request (text, options) and phonemizes it.
- `tts_engine` runs the acoustic model sentence by sentence (the prior, then
  the flow in windows: short first ones, so the vocoder starts early) and
  streams the latent to its `stream_to` stage in chunks of
  `LATENT_CHUNK_FRAMES` frames: `{"latent": float32 ndarray (192, n)}`.
- `vocoder` decodes those chunks as soon as each decode window has its right
  context and streams `{"audio": float32 ndarray in [-1, 1], "sample_rate": int}`,
  the chunk shape the Synthesis service turns into 16-bit PCM.

The classes are also the building blocks of the stand-in executors
(stages/standins.py): a stand-in changes where a prepared request is kept
(`Preprocessing.publish` / `TtsEngine.take`), never how speech is made, so
with both noise scales at 0 every model speaks the same bytes as the demo.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

import numpy as np

from stagevisor.stages.preprocessing import PhonemePreprocessing, PreparedPhonemes
from stagevisor.stages.base import StageContext, StageError, StagePayload
from stagevisor.stages.compute import DeadlinePool, compute_pool
from stagevisor.stages.piper.chunked import (
    CONTEXT_FRAMES,
    HOP_SAMPLES,
    LATENT_CHANNELS,
    WINDOW_SCHEDULE,
    ChunkedDecoder,
    DecodeJob,
)
from stagevisor.stages.piper.options import SynthesisOptions, parse_options
from stagevisor.stages.piper.voice import Voice, load_voice

# Frames per streamed latent chunk (~0.37 s of audio). The engine alone picks
# chunk boundaries; the vocoder's output does not depend on them.
LATENT_CHUNK_FRAMES = 32
# The flow windows of a request's first sentence end where the vocoder's first
# decode windows can start: at each one's end plus its right context. When
# the engine has no other request, the first (32 + 12 frames) makes first
# audio wait for the prior and that much flow, not for the whole sentence's
# flow, and a second one ends where the second decode window can start, so
# the vocoder decodes that window on one core while the flow computes the
# rest on the other (tests/benchmarks/bench_piper.py at concurrency 1). The
# short windows compute at once, a thread each: flow windows are independent
# (their context comes from the prior), so the second no longer waits for the
# first, and the rest of the sentence starts once both are done, after the
# vocoder's first window was queued (bench_voice.py: both done in 0.66x-0.70x
# the time, the first in 1.16x; one request at a time, in process, 80
# interleaved requests each: 1.04x the audio per wall second, first audio
# within 4 ms). Only where a Vocoder computes in the same process, though:
# the pool's deadline order then keeps the first decode window ahead of the
# rest of the sentence. With the vocoder in a process of its own, first audio
# came 7 ms after the colocated topology's (median of 9 runs, two of them
# with an experimental gate in the vocoder), against +4 and +2 ms with the
# windows one after the other (bench_piper.py at concurrency 1); most likely
# the second window's frames reach the vocoder while it decodes its first,
# and two processes' threads share the cores by the operating system's
# scheduling, not by deadline (not shown directly). Every
# window boundary costs 2 * FLOW_CONTEXT_FRAMES frames of flow; under load the
# other requests keep both cores busy and first audio waits on the compute
# pool's queue more than on the flow, so there the sentence is one window
# (4 interleaved runs at concurrency 8: 1.04x the audio per second for 0.96x
# the CPU, first audio 612 ms against 640 ms; with the vocoder isolated 1.03x,
# 570 ms against 510 ms). The rest of the sentence, and every later
# sentence, is one window. Windows never change the latent
# (tests/unit/stages/test_voice.py), so the choice changes no byte.
FLOW_WINDOWS_ALONE = 2
FLOW_WINDOWS_UNDER_LOAD = 0
# Deadlines in the process's compute pool (stages/compute.py). A request's
# work until its first audio is needed FIRST_AUDIO_SECONDS after it arrived,
# so a stream already playing, whose next window is needed sooner, goes
# first; once playing, a decode window is needed when the audio before it has
# played, and the engine's later work ENGINE_LEAD_SECONDS before that (the
# vocoder still has to decode what it computes).
FIRST_AUDIO_SECONDS = 0.5
ENGINE_LEAD_SECONDS = 1.0
_DECODING_POOLS: "weakref.WeakSet[DeadlinePool]" = weakref.WeakSet()
"""The compute pools a Vocoder runs its decode windows in (see FLOW_WINDOWS_ALONE)."""
# Windows of one request decoded at once, a thread each. Windows are independent,
# so this changes when audio is ready, never its bytes.
PARALLEL_DECODES = 2


class PreparedRequest(PreparedPhonemes[SynthesisOptions]):
    """What preprocessing hands the engine: phoneme ids per sentence and validated options."""

    @classmethod
    def options_from_data(cls, data: Any) -> SynthesisOptions:
        return SynthesisOptions(**{k: float(v) for k, v in data.items()})


class Preprocessing(PhonemePreprocessing[SynthesisOptions]):
    """Validates the request and phonemizes its text with the embedded Piper voice."""

    prepared = PreparedRequest

    def __init__(self, voice: Voice | None = None) -> None:
        self.voice = voice or load_voice()

    @property
    def voices(self) -> list[dict[str, Any]]:
        """The voices this stage accepts (the embedded one); the daemon lists them at GET /v1/audio/voices."""
        return [self.voice.describe()]

    def check_voice(self, requested: Any) -> None:
        self.voice.check_voice(requested)

    def read_options(self, request: dict[str, Any]) -> SynthesisOptions:
        return parse_options(request.get("options"), self.voice.defaults)

    def phonemize(self, text: str) -> list[list[int]]:
        return self.voice.phoneme_ids(text)


class TtsEngine:
    """Generates latent frames sentence by sentence and streams them in fixed-size chunks."""

    stage = "tts_engine"

    def __init__(self, voice: Voice | None = None) -> None:
        self.voice = voice or load_voice()
        self.requests = 0  # requests in `process` now, this one included
        self.pool = compute_pool()  # built here, so a bad STAGEVISOR_COMPUTE_THREADS fails the worker's start

    def take(self, payload: StagePayload) -> PreparedRequest:
        """The prepared request for this payload; the demo reads it from the payload's data."""
        return PreparedRequest.from_data(payload.data, self.stage)

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        self.requests += 1
        try:
            return await self._generate(self.take(payload), ctx)
        finally:
            self.requests -= 1

    async def _generate(self, prepared: PreparedRequest, ctx: StageContext) -> dict[str, Any]:
        frames = 0
        arrived, frame_seconds = time.monotonic(), HOP_SAMPLES / self.voice.sample_rate

        def deadline() -> float:  # for the next frames: see FIRST_AUDIO_SECONDS
            return arrived + FIRST_AUDIO_SECONDS + max(0.0, frames * frame_seconds - ENGINE_LEAD_SECONDS)

        for sentence in prepared.phoneme_ids:
            if ctx.cancelled:
                break
            # Alone, the first sentence's prior has both cores (nothing can overlap it) and its flow is cut
            # finer; a later sentence overlaps the decoding of those before it.
            alone, first_sentence = self.requests == 1, frames == 0
            prior = await self.pool.run(
                deadline(), self.voice.prior, sentence, prepared.options, alone and first_sentence
            )
            first = (FLOW_WINDOWS_ALONE if alone else FLOW_WINDOWS_UNDER_LOAD) if first_sentence else 0
            ends = flow_windows(prior.frames, first=first)
            windows = list(zip([0, *ends[:-1]], ends, strict=True))
            # Where the vocoder decodes in this pool, the short windows go to it at once, a thread each (flow
            # windows are independent, see FLOW_WINDOWS_ALONE); the rest of the sentence once they are done,
            # so that the vocoder's first window, queued meanwhile, runs before it.
            at_once = windows[:-1] if self.pool in _DECODING_POOLS else []
            short = [
                asyncio.ensure_future(self.pool.run(deadline(), self.voice.flow, prior, start, end))
                for start, end in at_once
            ]
            try:
                for index, (start, end) in enumerate(windows):
                    if ctx.cancelled:
                        break
                    # The vocoder decodes what is streamed while the flow computes the next window (another core).
                    if index < len(short):
                        latent = await short[index]
                    else:
                        latent = await self.pool.run(deadline(), self.voice.flow, prior, start, end)
                    for offset in range(0, latent.shape[1], LATENT_CHUNK_FRAMES):
                        if ctx.cancelled:
                            break
                        chunk = np.ascontiguousarray(latent[:, offset : offset + LATENT_CHUNK_FRAMES])
                        await ctx.stream({"latent": chunk})
                        frames += chunk.shape[1]
            finally:
                for flow in short:  # cancelled or failed: a window not started yet is dropped (compute.py)
                    if flow.done() and not flow.cancelled():
                        flow.exception()  # retrieved: a window left behind after an error is not logged again
                    flow.cancel()
        return {"frames": frames, "sentences": len(prepared.phoneme_ids), **self.final_extras(prepared)}

    def final_extras(self, prepared: PreparedRequest) -> dict[str, Any]:
        """Small facts the engine reports with its final data (stand-ins add their conditioning)."""
        return {}


def flow_windows(frames: int, first: int) -> list[int]:
    """Where a sentence's flow windows end: `first` short ones, then the rest of the sentence.

    The k-th short window ends where the vocoder's k-th decode window has its
    right context (see FLOW_WINDOWS_ALONE); a request's later sentences pass
    first=0.
    """
    ends, decoded = [], 0
    for window in range(first):
        decoded += WINDOW_SCHEDULE[min(window, len(WINDOW_SCHEDULE) - 1)]
        if decoded + CONTEXT_FRAMES >= frames:
            break
        ends.append(decoded + CONTEXT_FRAMES)
    return [*ends, frames] if frames > 0 else []


class Vocoder:
    """Decodes streamed latent chunks into audio chunks with overlap; also accepts a whole latent in `data`."""

    stage = "vocoder"

    def __init__(self, voice: Voice | None = None) -> None:
        self.voice = voice or load_voice()
        self.pool = compute_pool()  # built here, so a bad STAGEVISOR_COMPUTE_THREADS fails the worker's start
        _DECODING_POOLS.add(self.pool)

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        decoder = ChunkedDecoder(self.voice.decode)
        decodes = _OrderedDecodes(
            self.pool, self.voice.decode, self._emit_one, ctx, HOP_SAMPLES / self.voice.sample_rate
        )
        try:
            async for chunk in ctx.chunks():
                decoder.add(self._latent_of(chunk))
                # Windows decode on threads while this loop keeps taking the engine's chunks
                # (start() never waits for a thread), so the engine and the vocoder work on
                # one request at the same time.
                await decodes.start(decoder.take(final=False))
                if ctx.cancelled:
                    break
            else:
                # Robustness: an upstream wired as a plain `next` edge (no stream)
                # hands over the whole latent in its final data instead.
                if decoder.frames == 0 and "latent" in payload.data:
                    decoder.add(self._latent_of(payload.data))
                await decodes.start(decoder.take(final=True))
            samples = await decodes.finish()
        finally:
            decodes.cancel()
        if decoder.frames == 0 and not ctx.cancelled:
            raise StageError(
                f"stage {self.stage!r} received no latent frames; its upstream must stream "
                "{'latent': (192, n) float32} chunks to it or return a whole 'latent'"
            )
        return {"frames": decoder.frames, "samples": samples, "sample_rate": self.voice.sample_rate}

    async def _emit_one(self, ctx: StageContext, audio: np.ndarray) -> None:
        # The decoder ends in tanh; the clip guards the contract, in place when the window's array is ours to change.
        audio = np.clip(audio, -1.0, 1.0, out=audio if audio.flags.writeable else None)
        await ctx.stream({"audio": audio, "sample_rate": self.voice.sample_rate})

    def _latent_of(self, chunk: Any) -> np.ndarray:
        try:
            latent = chunk["latent"]
            if hasattr(latent, "detach"):  # a torch tensor from a real engine
                latent = latent.detach().cpu().numpy()
            latent = np.asarray(latent, dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise StageError(f"stage {self.stage!r} received a chunk without a 'latent' array: {exc!r}") from None
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise StageError(
                f"stage {self.stage!r} needs latent chunks of shape ({LATENT_CHANNELS}, frames), got {latent.shape}"
            )
        return latent


class _OrderedDecodes:
    """Decode windows concurrently (a thread each, at most PARALLEL_DECODES of one request) and stream in order.

    Windows wait their turn here, not in the stage's chunk loop: the vocoder
    keeps taking the engine's chunks while its decodes run, so the engine is
    never held up by them (its stream window stays open) and goes on to the
    next sentence on another core. Windows start in order as threads free up.
    An emitter task awaits the decodes in window order and streams each as
    soon as it and every window before it are done, so first audio leaves as
    early as with sequential decoding.

    Each window is needed when the audio before it has played: its deadline
    in the process's compute pool is the time the first audio left plus the
    window's start in seconds of audio; before the first audio leaves, the
    time the stream opened plus FIRST_AUDIO_SECONDS stands for it.
    """

    def __init__(self, pool: DeadlinePool, decode: Any, emit: Any, ctx: StageContext, frame_seconds: float) -> None:
        self._pool = pool
        self._decode = decode
        self._emit = emit
        self._ctx = ctx
        self._frame_seconds = frame_seconds
        self._playing_since = time.monotonic() + FIRST_AUDIO_SECONDS  # then the first audio's departure
        self._slots = asyncio.Semaphore(PARALLEL_DECODES)
        self._order: asyncio.Queue = asyncio.Queue()
        self._emitter = asyncio.ensure_future(self._emit_in_order())
        self.samples = 0

    async def start(self, jobs: list[DecodeJob]) -> None:
        """Queue windows for decoding; returns at once (they start as threads free up, in order)."""
        if jobs and self._emitter.done():  # the emitter failed (client gone): stop decoding
            await self._emitter
        for job in jobs:
            self._order.put_nowait(asyncio.ensure_future(self._run(job)))

    async def _run(self, job: DecodeJob) -> np.ndarray:
        async with self._slots:  # FIFO: windows start in the order they were queued
            deadline = self._playing_since + job.start * self._frame_seconds
            return await self._pool.run(deadline, job.run, self._decode)

    async def _emit_in_order(self) -> None:
        while (decoded := await self._order.get()) is not None:
            audio = await decoded
            if not self._ctx.cancelled:
                if not self.samples:
                    self._playing_since = time.monotonic()
                await self._emit(self._ctx, audio)
                self.samples += audio.shape[0]

    async def finish(self) -> int:
        self._order.put_nowait(None)
        await self._emitter
        return self.samples

    def cancel(self) -> None:
        if not self._emitter.done():
            self._emitter.cancel()
        while not self._order.empty():
            pending = self._order.get_nowait()
            if pending is not None:
                pending.cancel()


def preprocessing() -> Preprocessing:
    """Factory for the demo model's `preprocessing` stage."""
    return Preprocessing()


def tts_engine() -> TtsEngine:
    """Factory for the demo model's `tts_engine` stage."""
    return TtsEngine()


def vocoder() -> Vocoder:
    """Factory for the demo model's `vocoder` stage."""
    return Vocoder()
