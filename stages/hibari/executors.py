"""The default voice's executors: preprocessing (G2P) ~> tts_engine (acoustic ONNX) ~> vocoder (iSTFT DSP), on hibari.

- `preprocessing` validates the request (text, voice, options) and turns the
  text into phoneme ids, one list per sentence chunk, as hibari cuts them, a
  sentence at a time: it streams each sentence's
  `{"phoneme_ids": [[int]], "options": {...}}` as soon as the G2P has read it
  (the demo declares preprocessing ~> tts_engine a stream_to edge), then
  returns all of them, so first audio does not wait for the G2P of the rest
  of the text.
- `tts_engine` runs the acoustic model sentence by sentence, starting on the
  first sentence streamed to it (or on the payload's, behind a plain edge;
  each sentence's pass queued while the one before it runs, so a free core
  starts on it) and
  streams each sentence's frames to its `stream_to` stage, in order, as soon
  as they exist:
  `{"lh", "theta", "ln", "lr", "phi": float32 (601, F), "f0": float32 (F,),
  "seed": int}`, about 1 MB per second of audio. While the first sentence's
  acoustic pass runs it streams `{"seed": int, "noise_frames": int}` ahead:
  a little fewer frames than that sentence will have.
- `vocoder` turns each sentence's frames into audio with one numpy Generator
  per request (seeded from the chunks' `seed`, advanced in sentence order, as
  the package does), a run of frames at a time (stages/hibari/render.py: the
  package's DSP in pieces, the same samples), and streams each run as
  `{"audio": float32 in [-1, 1], "sample_rate": 24000}` as soon as it is
  computed: a sentence's first 0.2 s, then 1.2 s, then 4.8 s at a time. The
  later runs are queued together once the first is made, each one call, so
  free cores make them while the first is handed on. On the
  `noise_frames` chunk it draws the first sentence's noise ahead, while the
  acoustic model runs, so that sentence's first audio waits for 16 frames of
  DSP only. It keeps each recent seed's draw (render.NoiseBook: the values
  the package's Generator gives, sentence after sentence), so a request with
  a seed used before, such as every request that names none, draws no noise.

So the audio of every topology (colocated, any stage isolated, replicas) is
the package's own `Hibari()(text, speed, seed)`, sample for sample, when every
worker runs the acoustic session with the same thread count
(STAGEVISOR_ORT_THREADS; default 1, the package's default).

The classes keep the hooks the stand-in executors (stages/standins.py) change:
`Preprocessing.conditioning` / `publish`, `TtsEngine.take` / `final_extras`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import math
import time
from typing import Any, AsyncGenerator

import numpy as np

from stagevisor.stages.preprocessing import PhonemePreprocessing, PreparedPhonemes
from stagevisor.stages.base import StageContext, StageError, StagePayload
from stagevisor.stages.compute import compute_pool
from stagevisor.stages.hibari.render import NoiseBook, RequestNoise, SentenceRenderer, warm_up
from stagevisor.stages.hibari.voice import (
    BINS,
    HOP_SAMPLES,
    SAMPLE_RATE,
    SEED_MAX,
    SPECTRAL_PARTS,
    Acoustic,
    HibariOptions,
    Phonemizer,
    check_voice as check_hibari_voice,
    describe_voice,
    load_acoustic,
    load_phonemizer,
    parse_options,
)

# Deadlines in the process's compute pool (stages/compute.py): a request's work
# until its first audio is needed FIRST_AUDIO_SECONDS after it arrived, so a
# stream already playing, whose next sentence is needed sooner, goes first;
# once playing, a sentence is needed when the audio before it has played, and
# the engine's work ENGINE_LEAD_SECONDS before that (the vocoder still renders it).
FIRST_AUDIO_SECONDS = 0.5
ENGINE_LEAD_SECONDS = 1.0
PASSES_AHEAD = 1
"""Acoustic passes a request queues beyond the sentence it waits for."""
LATER_SENTENCE_GRACE_SECONDS = 0.1
"""How much later than its audio's need a later sentence's acoustic pass is due (see TtsEngine.process)."""
MAX_NOISE_AHEAD_FRAMES = 8192
"""The most frames' noise a vocoder is asked to draw ahead of a sentence (102 s of audio), whatever it is told; it
draws at most NOISE_FRAMES_KEPT of them, the part of the seed's draw it keeps."""
NOISE_SEEDS_KEPT = 4
"""Seeds whose noise draw a vocoder keeps (the last used): requests that name no seed share the default's."""
NOISE_FRAMES_KEPT = 3200
"""Frames of each kept seed's draw (40 s of audio, 15.4 MB at most a seed, filled as requests need it)."""


def noise_frames_hint(ids: int, speed: float) -> int:
    """A little fewer frames than the acoustic model makes for a sentence of `ids` phoneme ids at `speed`: it
    made 4.7 to 12.4 frames a phoneme (x speed) on the sentences measured (tests/unit/stages/test_hibari.py), so
    noise drawn ahead for 4.5 is all used and the vocoder draws the rest (a few percent) once the frames exist."""
    return min(MAX_NOISE_AHEAD_FRAMES, math.floor(4.5 * ids / speed))


class PreparedRequest(PreparedPhonemes[HibariOptions]):
    """What preprocessing hands the engine: phoneme ids per sentence chunk and validated options."""

    @classmethod
    def options_from_data(cls, data: Any) -> HibariOptions:
        return HibariOptions(float(data["speed"]), int(data["seed"]))


class Preprocessing(PhonemePreprocessing[HibariOptions]):
    """Validates the request and turns its text into phoneme ids (hibari's G2P)."""

    prepared = PreparedRequest

    def __init__(self, phonemizer: Phonemizer | None = None) -> None:
        self.phonemizer = phonemizer or load_phonemizer()

    @property
    def voices(self) -> list[dict[str, Any]]:
        """The voices this stage accepts; the daemon lists them at GET /v1/audio/voices."""
        return [describe_voice()]

    def check_voice(self, requested: Any) -> None:
        check_hibari_voice(requested)

    def read_options(self, request: dict[str, Any]) -> HibariOptions:
        return parse_options(request.get("options"), request.get("seed"))

    def sentences(self, text: str) -> list[str]:
        return self.phonemizer.sentences(text)

    def phonemize(self, text: str) -> list[list[int]]:
        return self.phonemizer.sentence_ids(text)

    def silent(self, ids: list[int]) -> bool:
        return self.phonemizer.silent(ids)


class TtsEngine:
    """Runs the acoustic model sentence by sentence and streams each sentence's frames."""

    stage = "tts_engine"

    def __init__(self, acoustic: Acoustic | None = None) -> None:
        self.acoustic = acoustic or load_acoustic()
        self.pool = compute_pool()  # built here, so a bad STAGEVISOR_COMPUTE_THREADS fails the worker's start

    def take(self, payload: StagePayload) -> PreparedRequest:
        """The prepared request for this payload; the default voice reads it from the payload's data."""
        return PreparedRequest.from_data(payload.data, self.stage)

    async def parts(self, payload: StagePayload, ctx: StageContext) -> AsyncGenerator[PreparedRequest, None]:
        """The prepared request in the parts it arrives in: each chunk preprocessing streams (a sentence's ids,
        with the options) behind a stream_to edge, else the whole of it from the payload (`take`)."""
        streamed = False
        async for chunk in ctx.chunks():
            streamed = True
            yield PreparedRequest.from_data(chunk, self.stage)
        if not streamed:
            yield self.take(payload)

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        parts = self.parts(payload, ctx)
        try:
            return await self._speak(parts, ctx)
        finally:
            await parts.aclose()

    async def _speak(self, parts: AsyncGenerator[PreparedRequest, None], ctx: StageContext) -> dict[str, Any]:
        prepared = await anext(parts)
        arrived, frames = time.monotonic(), 0
        speed, seed = prepared.options.speed, prepared.options.seed
        sentences = list(prepared.phoneme_ids)  # grows as the parts come
        more = True

        async def arrived_up_to(count: int) -> None:
            nonlocal more
            while more and len(sentences) < count:
                part = await anext(parts, None)
                more = part is not None
                sentences.extend(part.phoneme_ids if part is not None else ())

        # A sentence's acoustic pass is queued while the one before it runs, so a free core starts on it while the
        # vocoder makes the earlier sentence's audio. It is due when the audio before it will have played, less
        # ENGINE_LEAD_SECONDS, counting the sentences not yet made at the hint's (fewer) frames (never later
        # than it is needed), and a later sentence's pass LATER_SENTENCE_GRACE_SECONDS after that, so that it
        # never takes a core from first-audio work due at the same time (its own request's noise draw).
        passes: collections.deque[concurrent.futures.Future] = collections.deque()  # queued, not yet streamed
        queued = expected = 0

        def queue_passes(upto: int) -> None:
            nonlocal queued, expected
            while queued < min(upto, len(sentences)):
                lead = max(0.0, expected * HOP_SAMPLES / SAMPLE_RATE - ENGINE_LEAD_SECONDS)
                lead += LATER_SENTENCE_GRACE_SECONDS if queued else 0.0
                ids = sentences[queued]
                passes.append(self.pool.submit(arrived + FIRST_AUDIO_SECONDS + lead, self.acoustic.frames, ids, speed))
                queued += 1
                expected += noise_frames_hint(len(ids), speed)

        async def look_ahead(upto: int) -> None:
            await arrived_up_to(upto)
            queue_passes(upto)

        index = 0
        ahead: asyncio.Future[None] | None = None  # the only reader of `parts` while it runs
        try:
            while not ctx.cancelled:
                if ahead is not None:
                    await ahead
                await arrived_up_to(index + 1)
                if index == len(sentences):
                    break
                ids = sentences[index]
                queue_passes(index + 1)
                if index == 0:  # the vocoder draws this sentence's noise while the acoustic model runs
                    await ctx.stream({"seed": seed, "noise_frames": noise_frames_hint(len(ids), speed)})
                # The next sentence's ids come from preprocessing while this pass runs (behind a stream_to edge),
                # and its pass is queued as soon as they do; this sentence's frames never wait for them.
                ahead = asyncio.ensure_future(look_ahead(index + 1 + PASSES_AHEAD))
                sentence = await asyncio.wrap_future(passes[0])
                passes.popleft()  # a streamed sentence's frames are not held for the rest of the request
                await ctx.stream({**sentence, "seed": seed})
                made = sentence["f0"].shape[0]
                frames += made
                expected += made - noise_frames_hint(len(ids), speed)
                index += 1
        finally:
            if ahead is not None:
                ahead.cancel()  # before `parts` is closed: a generator cannot close while a read of it runs
                await asyncio.gather(ahead, return_exceptions=True)  # and a failed read is not left unretrieved
            for pending in passes:
                pending.cancel()  # not started yet: dropped (cancelled, or failed while streaming)
        return {"frames": frames, "sentences": len(sentences), **self.final_extras(prepared)}

    def final_extras(self, prepared: PreparedRequest) -> dict[str, Any]:
        """Small facts the engine reports with its final data (stand-ins add their conditioning)."""
        return {}


class Vocoder:
    """Renders each streamed sentence's frames into audio (hibari's DSP) and streams it."""

    stage = "vocoder"

    def __init__(self) -> None:
        self.pool = compute_pool()  # built here, so a bad STAGEVISOR_COMPUTE_THREADS fails the worker's start
        self.noise = NoiseBook(BINS, seeds=NOISE_SEEDS_KEPT, limit_frames=NOISE_FRAMES_KEPT)
        warm_up()  # the DSP's first-call setup at build time, not in the first request's first audio

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        noise: RequestNoise | None = None
        sentences = samples = 0
        # Until the first audio leaves, it is due now: a request whose frames exist is the nearest to its first
        # audio, so its DSP goes before acoustic passes not yet started (due FIRST_AUDIO_SECONDS after their
        # request arrived). Then a run is due when the audio before it has played.
        playing_since = time.monotonic()
        drawing: concurrent.futures.Future | None = None  # the compute call drawing the first sentence's noise
        try:
            async for chunk in ctx.chunks():
                if isinstance(chunk, dict) and "f0" not in chunk and not sentences and noise is None:
                    seed, count = self._announcement(chunk)
                    noise = self.noise.request(seed)
                    # Due with the request's acoustic passes, not before them: on an idle core it overlaps the
                    # first one; on busy cores it yields to work queued earlier (and is dropped if not started).
                    # Nothing to draw when the seed's draw is kept that far (a request before used the seed).
                    drawing = self.pool.submit(playing_since + FIRST_AUDIO_SECONDS, noise.ahead, count)
                    continue
                frames, seed = self._frames_of(chunk)
                if noise is None:  # one draw per request, read sentence by sentence as the package's Generator
                    noise = self.noise.request(seed)
                if drawing is not None:
                    drawing.cancel()  # not started: the first run draws what it needs; running: it keeps drawing
                    drawing = None
                # The sentence's noise (what was not drawn ahead) and its first run (0.2 s of audio) in one call;
                # then every later run at once, each one call due when the audio before it has played: free cores
                # compute them while the first is handed on, two later runs on two cores at once.
                due = playing_since + samples / SAMPLE_RATE
                renderer, (first, *later), audio = await self.pool.run(due, _first_run, frames, noise)
                if audio is not None and not samples:
                    playing_since = time.monotonic()
                queued = [
                    (
                        end,
                        self.pool.submit(
                            playing_since + (samples + start * HOP_SAMPLES) / SAMPLE_RATE, renderer.compute, start, end
                        ),
                    )
                    for start, end in later
                ]
                try:
                    for end, computed in [(first[1], None), *queued]:
                        if ctx.cancelled:
                            break
                        if computed is not None:
                            await asyncio.wrap_future(computed)
                            audio = await self.pool.run(playing_since + samples / SAMPLE_RATE, renderer.emit, end)
                        if audio is None:
                            continue
                        np.clip(audio, -1.0, 1.0, out=audio)
                        if not samples:
                            playing_since = time.monotonic()
                        samples += audio.shape[0]
                        await ctx.stream({"audio": audio, "sample_rate": SAMPLE_RATE})
                finally:
                    for _, computed in queued:
                        computed.cancel()  # not started yet: dropped (cancelled, or failed while handing on)
                if ctx.cancelled:
                    break
                sentences += 1
        finally:
            if drawing is not None:  # the request ended before its first frames: no draw for it if not started
                drawing.cancel()
        if not sentences and not ctx.cancelled:
            raise StageError(
                f"stage {self.stage!r} received no acoustic frames; its upstream must stream "
                "{'lh', 'theta', 'ln', 'lr', 'phi': (601, F) float32, 'f0': (F,) float32, 'seed': int} chunks to it"
            )
        return {"sentences": sentences, "samples": samples, "sample_rate": SAMPLE_RATE}

    def _announcement(self, chunk: dict[str, Any]) -> tuple[int, int]:
        """(seed, frames to draw ahead) of the engine's chunk announcing the first sentence."""
        try:
            seed, count = int(chunk["seed"]), int(chunk["noise_frames"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StageError(
                f"stage {self.stage!r} received a first chunk with neither hibari's acoustic frames nor "
                f"{{'seed': int, 'noise_frames': int}}: {exc!r}"
            ) from None
        if not 0 <= seed <= SEED_MAX:
            raise StageError(f"stage {self.stage!r} received seed {seed}, outside [0, {SEED_MAX}]")
        return seed, max(0, min(count, MAX_NOISE_AHEAD_FRAMES))

    def _frames_of(self, chunk: Any) -> tuple[dict[str, np.ndarray], int]:
        try:
            f0 = np.asarray(chunk["f0"], dtype=np.float32)
            parts = {name: np.asarray(chunk[name], dtype=np.float32) for name in SPECTRAL_PARTS}
            seed = int(chunk["seed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StageError(
                f"stage {self.stage!r} received a chunk without hibari's acoustic frames: {exc!r}"
            ) from None
        shapes = {name: part.shape for name, part in parts.items()}
        if f0.ndim != 1 or any(shape != (BINS, f0.shape[0]) for shape in shapes.values()):
            raise StageError(
                f"stage {self.stage!r} needs spectral parts of shape ({BINS}, F) and f0 of shape (F,), "
                f"got f0 {f0.shape} and {shapes}"
            )
        if not 0 <= seed <= SEED_MAX:
            raise StageError(f"stage {self.stage!r} received seed {seed}, outside [0, {SEED_MAX}]")
        return {**parts, "f0": f0}, seed


def _first_run(
    frames: dict[str, np.ndarray], noise: RequestNoise
) -> tuple[SentenceRenderer, list[tuple[int, int]], np.ndarray | None]:
    """A sentence's renderer (its noise), its runs' frame ranges and its first run of audio, in one compute call."""
    renderer = SentenceRenderer(frames, noise.take(frames["f0"].shape[0]))
    runs = renderer.ranges()
    start, end = runs[0]
    renderer.compute(start, end)
    return renderer, runs, renderer.emit(end)


def preprocessing() -> Preprocessing:
    """Factory for the default voice's `preprocessing` stage."""
    return Preprocessing()


def tts_engine() -> TtsEngine:
    """Factory for the default voice's `tts_engine` stage."""
    return TtsEngine()


def vocoder() -> Vocoder:
    """Factory for the default voice's `vocoder` stage."""
    return Vocoder()
