"""The default voice's executors (hibari): G2P, acoustic engine and DSP vocoder as a chain, against the package."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hibari import Hibari
from hibari.g2p import SUBTOKEN_RE

from stagevisor.stages.base import InvalidRequest, StageError, StagePayload
from stagevisor.stages.hibari import executors as hibari_stages
from stagevisor.stages.preprocessing import cut_long_chunk
from stagevisor.stages.hibari.voice import (
    BINS,
    G2P_BUDGET,
    MAX_CHUNK_PHONEMES,
    SAMPLE_RATE,
    SPECTRAL_PARTS,
    HibariOptions,
    g2p_work,
    load_phonemizer,
    parse_options,
)
from tests.fakes import FakeClock
from tests.unit.stage_driver import END, DriverContext, request, run_chain

SHORT = "Hello there."
LONG = (
    "Hello there. The weather today is bright and clear, with a gentle breeze from the west! "
    "On the 3rd of March 2024, 1,250 people paid $9.99 each."
)


@pytest.fixture(scope="module")
def stages():
    return [hibari_stages.preprocessing(), hibari_stages.tts_engine(), hibari_stages.vocoder()]


@pytest.fixture(scope="module")
def package() -> Hibari:
    """The package's own synthesizer at its defaults (one onnxruntime thread, as the stages' default)."""
    return Hibari()


def own_synthesis(package: Hibari, text: str, speed: float = 1.0, seed: int = 0) -> np.ndarray:
    """What the package makes for `text`, clipped as every audio chunk of the Stage contract is."""
    return np.clip(package(text, speed=speed, seed=seed), -1.0, 1.0)


def test_the_chain_speaks_at_24_khz_float32_mono_in_unit_range(stages):
    result = run_chain(stages, request(LONG))
    assert result.sample_rate == SAMPLE_RATE == 24000
    for chunk in result.chunks:
        assert chunk["audio"].dtype == np.float32 and chunk["audio"].ndim == 1
        assert np.abs(chunk["audio"]).max() <= 1.0
    assert float(np.sqrt(np.mean(np.square(result.audio(), dtype=np.float64)))) > 0.01


DEMO_EDGES = {0, 1}
"""The demo's streaming edges: preprocessing ~> tts_engine (a sentence at a time) ~> vocoder."""


@pytest.mark.parametrize("edges", [DEMO_EDGES, {1}], ids=["sentence stream", "plain edge"])
@pytest.mark.parametrize("text", [SHORT, LONG])
def test_audio_equals_the_package_own_synthesis_sample_for_sample(stages, package, text, edges):
    audio = run_chain(stages, request(text), stream_edges=edges).audio()
    assert audio.tobytes() == own_synthesis(package, text).tobytes()


def test_seed_and_speed_reach_the_package_unchanged(stages, package):
    audio = run_chain(stages, request(LONG, seed=7, speed=1.3)).audio()
    assert audio.tobytes() == own_synthesis(package, LONG, speed=1.3, seed=7).tobytes()


def test_the_seed_changes_only_the_noise(stages):
    first = run_chain(stages, request(SHORT, seed=1)).audio()
    second = run_chain(stages, request(SHORT, seed=2)).audio()
    assert first.shape == second.shape and first.tobytes() != second.tobytes()


def test_audio_is_bit_identical_run_to_run(stages):
    assert run_chain(stages, request(LONG)).audio().tobytes() == run_chain(stages, request(LONG)).audio().tobytes()


def test_preprocessing_cuts_sentences_as_the_package_does(stages, package):
    result = run_chain(stages, request(LONG))
    sentences = package.phonemize(LONG)
    assert len(sentences) == 3 and result.finals[-1]["sentences"] == 3
    assert result.finals[0]["phoneme_ids"] == [package.ids(ps) for ps in sentences]


def test_the_vocoder_streams_a_sentence_first_0_2_s_then_1_2_s_then_4_8_s_at_a_time(stages, package):
    from stagevisor.stages.hibari.voice import Acoustic

    acoustic = Acoustic(threads=1)
    expected = []
    for ps in package.phonemize(LONG):
        frames = acoustic.frames(package.ids(ps), 1.0)["f0"].shape[0]
        # 16 frames less the 2 blocks synth drops as padding, 96, then 384 at a time; the last run also
        # closes the overlap-add (2 blocks more).
        runs = [16 - 2, 96, *[384] * (frames // 384 + 1)]
        while sum(runs) > frames:
            runs[-1] -= min(runs[-1], sum(runs) - frames)
            runs = [run for run in runs if run] if runs[-1] == 0 else runs
        expected += [run * 300 for run in runs]
    assert [chunk["audio"].shape[0] for chunk in run_chain(stages, request(LONG)).chunks] == expected
    assert max(expected) > 96 * 300  # LONG has a sentence long enough for a 4.8 s run


@pytest.mark.parametrize("first, second, later", [(16, 96, 384), (1, 7, 3), (5, 1000, 1), (2, 2, 2), (16, 3, 50)])
def test_rendering_in_runs_gives_the_package_dsp_samples_and_generator_state(package, first, second, later):
    from hibari import dsp

    from stagevisor.stages.hibari.render import SentenceRenderer, draw_noise
    from stagevisor.stages.hibari.voice import Acoustic

    acoustic = Acoustic(threads=1)
    for ps in package.phonemize(LONG + " Hi."):
        frames = acoustic.frames(package.ids(ps), 1.0)
        theirs, ours = np.random.default_rng(3), np.random.default_rng(3)
        whole = dsp.synth(*(frames[n] for n in SPECTRAL_PARTS), frames["f0"], theirs)
        pieces = np.concatenate(
            list(SentenceRenderer(frames, draw_noise(ours, BINS, frames["f0"].shape[0])).runs(first, second, later))
        )
        assert pieces.tobytes() == whole.tobytes()
        assert ours.random() == theirs.random()  # the Generator advanced exactly as the package's


def synthetic_frames(count: int, seed: int) -> dict[str, np.ndarray]:
    """Acoustic frames of any length: random spectral parts and an F0 curve with unvoiced stretches."""
    rng = np.random.default_rng(seed)
    frames = {name: rng.normal(-1.0, 1.5, (BINS, count)).astype(np.float32) for name in SPECTRAL_PARTS}
    f0 = rng.uniform(60.0, 400.0, count).astype(np.float32)
    f0[rng.random(count) < 0.25] = 0.0  # unvoiced frames
    return {**frames, "f0": f0}


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 16, 17, 18, 19, 113])
@pytest.mark.parametrize("first, second, later", [(16, 96, 384), (1, 3, 2), (4, 1000, 1), (16, 1, 7)])
def test_rendering_any_sentence_length_in_runs_gives_synth_samples(count, first, second, later):
    from hibari import dsp

    from stagevisor.stages.hibari.render import SentenceRenderer, draw_noise

    frames = synthetic_frames(count, seed=count)
    theirs, ours = np.random.default_rng(11), np.random.default_rng(11)
    whole = dsp.synth(*(frames[n] for n in SPECTRAL_PARTS), frames["f0"], theirs)
    pieces = np.concatenate(
        list(SentenceRenderer(frames, draw_noise(ours, BINS, frames["f0"].shape[0])).runs(first, second, later))
    )
    assert pieces.tobytes() == whole.tobytes()
    assert ours.random() == theirs.random()


@pytest.mark.parametrize("cuts", [[1], [3, 4, 20], [7, 64, 65, 199], list(range(1, 200))])
def test_the_pulse_train_made_in_pieces_is_the_package_pulse_train(cuts):
    from hibari import dsp

    from stagevisor.stages.hibari.render import PulseTrain

    f0 = synthetic_frames(200, seed=5)["f0"]
    pulses = PulseTrain(f0, dsp.SR, dsp.HOP)
    theirs = dsp.pulses(f0)
    # The phase is made as far as each read needs (in order); once made, any range reads the same again.
    ranges = [slice(start * dsp.HOP, end * dsp.HOP) for start, end in zip([0, *cuts], [*cuts, 200], strict=True)]
    pieces = [pulses.samples_at(samples) for samples in ranges]
    assert np.concatenate(pieces).tobytes() == theirs.tobytes()
    for samples, piece in reversed(list(zip(ranges, pieces, strict=True))):
        assert pulses.samples_at(samples).tobytes() == piece.tobytes()


def test_f0_exactly_at_the_voicing_threshold_is_unvoiced_as_in_the_package():
    """hibari calls a sample voiced when its F0 is above 40 Hz, not at it: a stretch of exactly 40 Hz has no pulses."""
    from hibari import dsp

    from stagevisor.stages.hibari.render import PulseTrain

    f0 = np.full(6, 40.0, np.float32)
    f0[3:] = 120.0  # voiced after the threshold stretch
    theirs = dsp.pulses(f0)
    ours = PulseTrain(f0, dsp.SR, dsp.HOP).samples_at(slice(0, 6 * dsp.HOP))
    assert ours.tobytes() == theirs.tobytes()
    # Most of the first two frames blend to exactly 40 Hz (a few round just above it): those samples are silent.
    assert (ours[: 2 * dsp.HOP] == 0).sum() > dsp.HOP and ours[4 * dsp.HOP :].any()


@pytest.mark.parametrize("frames", [1, 2, 3, 4, 5, 9, 40])
def test_the_padded_pulse_train_is_synth_reflection_of_it_anywhere(frames):
    from hibari import dsp

    from stagevisor.stages.hibari.render import PulseTrain

    f0 = synthetic_frames(frames, seed=frames)["f0"]
    pad = dsp.N_FFT // 2
    theirs = np.pad(dsp.pulses(f0), pad, mode="reflect")  # as synth's STFT pads it (several times over when short)
    total = theirs.shape[0]
    for start, stop in [(0, total), (0, 1), (total - 1, total), (0, pad + 1), (pad, total - pad), (3, total - 7)]:
        ours = PulseTrain(f0, dsp.SR, dsp.HOP).padded(start, stop, pad)
        assert ours.tobytes() == theirs[start:stop].tobytes(), (start, stop)


def test_disjoint_ranges_computed_on_several_threads_at_once_give_the_synth_samples(package):
    from concurrent.futures import ThreadPoolExecutor

    from hibari import dsp

    from stagevisor.stages.hibari.render import SentenceRenderer, draw_noise

    frames = synthetic_frames(700, seed=21)
    theirs, ours = np.random.default_rng(4), np.random.default_rng(4)
    whole = dsp.synth(*(frames[n] for n in SPECTRAL_PARTS), frames["f0"], theirs)
    renderer = SentenceRenderer(frames, draw_noise(ours, BINS, frames["f0"].shape[0]))
    cuts = [0, 16, 60, 112, 300, 301, 496, 700]
    with ThreadPoolExecutor(4) as threads:  # the later ranges first, all at once
        list(
            threads.map(lambda bounds: renderer.compute(*bounds), reversed(list(zip(cuts[:-1], cuts[1:], strict=True))))
        )
    audio = [renderer.emit(end) for end in cuts[1:]]
    assert np.concatenate([a for a in audio if a is not None]).tobytes() == whole.tobytes()


def test_a_run_never_leaves_a_tiny_last_run_except_the_first():
    from stagevisor.stages.hibari.render import SentenceRenderer, draw_noise

    def ranges(count: int) -> list[tuple[int, int]]:
        frames = synthetic_frames(count, seed=1)
        return SentenceRenderer(frames, draw_noise(np.random.default_rng(0), BINS, count)).ranges(16, 96, 384)

    assert ranges(20) == [(0, 16), (16, 20)]  # the first run stays short: it is the first audio
    assert ranges(130) == [(0, 16), (16, 130)]  # 18 frames after the second run: it takes them
    assert ranges(208) == [(0, 16), (16, 112), (112, 208)]
    assert ranges(504) == [(0, 16), (16, 112), (112, 504)]  # 8 frames after the third: it takes them
    assert ranges(591) == [(0, 16), (16, 112), (112, 591)]  # 95 frames after the third, under a quarter of it
    assert ranges(592) == [(0, 16), (16, 112), (112, 496), (496, 592)]  # 96: a run of its own


@pytest.mark.parametrize("frames", [9, 11])
def test_noise_that_is_not_the_sentence_shape_is_refused_even_as_complex64(frames):
    from stagevisor.stages.hibari.render import SentenceRenderer

    noise = np.zeros((BINS, frames), np.complex64)
    with pytest.raises(ValueError, match=r"must be \(601, 10\) complex64"):
        SentenceRenderer(synthetic_frames(10, seed=2), noise)


def test_a_sentence_emits_nothing_twice():
    """`emit` returns None when nothing new is complete, so a caller never hands on an empty chunk."""
    from stagevisor.stages.hibari.render import SentenceRenderer, draw_noise

    renderer = SentenceRenderer(synthetic_frames(40, seed=4), draw_noise(np.random.default_rng(0), BINS, 40))
    renderer.compute(0, 16)
    assert renderer.emit(16) is not None and renderer.emit(16) is None
    renderer.compute(16, 40)
    assert renderer.emit(40) is not None and renderer.emit(40) is None


def test_loading_the_acoustic_model_runs_it_once_before_any_request(package, monkeypatch):
    from stagevisor.stages.hibari import voice

    passes: list[int] = []
    real_frames = voice.Acoustic.frames

    def counted(self, ids, speed):
        passes.append(len(ids))
        return real_frames(self, ids, speed)

    monkeypatch.setattr(voice.Acoustic, "frames", counted)
    voice.load_acoustic.cache_clear()
    try:
        voice.load_acoustic()
    finally:
        voice.load_acoustic.cache_clear()  # later users load (and warm) their own, unpatched
    assert passes == [len(package.ids(voice.WARM_UP_PHONEMES))] and passes[0] > 30


def test_the_dsp_warm_up_renders_a_first_and_a_later_run_once_per_process():
    from stagevisor.stages.hibari import render

    render.warm_up.cache_clear()
    assert render.warm_up() == (render.FIRST_RUN_FRAMES + render.RUN_FRAMES) * 300
    assert render.warm_up.cache_info().misses == 1 and render.warm_up() and render.warm_up.cache_info().hits == 1


@pytest.mark.parametrize("sentences", [[1], [15, 16, 17], [48, 113, 2], [30, 30, 30, 30]])
@pytest.mark.parametrize("limit_frames", [1, 16, 40, 63, 500])
@pytest.mark.parametrize("ahead", [0, 1, 16, 40, 200])
def test_a_request_noise_is_the_package_generator_draws_sentence_after_sentence(sentences, limit_frames, ahead):
    from stagevisor.stages.hibari.render import NoiseBook

    book = NoiseBook(BINS, seeds=2, limit_frames=limit_frames)
    for _ in range(2):  # the second request with the seed reads what the first drew
        theirs = np.random.default_rng(9)
        noise = book.request(9)
        noise.ahead(ahead)
        for frames in sentences:
            whole = theirs.standard_normal((BINS, 2 * frames), dtype=np.float32).view(np.complex64)
            taken = noise.take(frames)
            assert taken.shape == (BINS, frames) and taken.dtype == np.complex64
            assert taken.tobytes() == whole.tobytes()


def test_drawing_ahead_draws_what_the_next_sentence_takes_and_no_more():
    """`ahead` is the first sentence's draw made while the acoustic model runs: its first run then draws nothing, and
    nothing is drawn that no sentence asked for."""
    from stagevisor.stages.hibari.render import RequestNoise, SeedNoise

    seed = SeedNoise(7, limit=BINS * 2 * 100)
    noise = RequestNoise(seed, BINS)
    noise.take(3)
    noise.ahead(10)
    assert seed.filled == BINS * 2 * 13
    noise.take(10)
    assert seed.filled == BINS * 2 * 13


def test_a_seed_keeps_exactly_its_limit_of_frames():
    """A request that stays within the kept frames reads them (read-only views); one frame past them is drawn on."""
    from stagevisor.stages.hibari.render import NoiseBook

    book = NoiseBook(BINS, seeds=1, limit_frames=50)
    assert book.request(4).take(50).flags.writeable is False  # all 50 kept
    assert book.request(4).take(51).flags.writeable is True  # the 51st is past them


def test_requests_of_one_seed_interleaved_each_get_the_whole_draw_and_cannot_change_it():
    from stagevisor.stages.hibari.render import NoiseBook

    book = NoiseBook(BINS, seeds=4, limit_frames=50)
    first, second = book.request(3), book.request(3)
    theirs = [np.random.default_rng(3), np.random.default_rng(3)]
    # (frames, request, within the kept 50 frames): within them a take is a view of the kept draw, read-only.
    for frames, index, kept in [(20, 0, True), (10, 1, True), (40, 0, False), (45, 1, False)]:
        expected = theirs[index].standard_normal((BINS, 2 * frames), dtype=np.float32).view(np.complex64)
        taken = [first, second][index].take(frames)
        assert taken.tobytes() == expected.tobytes()
        assert taken.flags.writeable is not kept
        if kept:
            with pytest.raises(ValueError, match="read-only"):
                taken[0, 0] = 1


def test_the_book_keeps_the_last_seeds_used_and_a_running_request_keeps_its_own():
    from stagevisor.stages.hibari.render import NoiseBook

    book = NoiseBook(BINS, seeds=2, limit_frames=8)
    running = book.request(1)
    running.take(4)
    book.request(2).ahead(8)
    book.request(3)  # seed 1 is dropped: the least recently used
    expected = np.random.default_rng(1).standard_normal(BINS * 2 * 12, dtype=np.float32)[BINS * 2 * 4 :]
    assert running.take(8).tobytes() == expected.tobytes()  # the kept four frames, then four past the limit
    again = book.request(2)
    assert again.take(8).tobytes() == np.random.default_rng(2).standard_normal((BINS, 16), dtype=np.float32).tobytes()
    assert book.kept_seeds() == [3, 2]


def test_threads_filling_one_seed_draw_at_once_give_one_draw():
    from concurrent.futures import ThreadPoolExecutor

    from stagevisor.stages.hibari.render import SeedNoise

    kept = SeedNoise(5, limit=40 * SeedNoise.BLOCK_VALUES + 7)
    ends = [kept.limit - step * 997 for step in range(64)]
    with ThreadPoolExecutor(4) as threads:
        list(threads.map(kept.fill, ends))
    whole = np.random.default_rng(5).standard_normal(kept.limit + 5, dtype=np.float32)
    assert kept.filled == kept.limit
    assert kept.read(0, kept.limit).tobytes() == whole[: kept.limit].tobytes()
    assert kept.past_limit().standard_normal(5, dtype=np.float32).tobytes() == whole[kept.limit :].tobytes()


def test_the_noise_hint_is_a_little_under_each_sentence_frames_so_no_draw_is_wasted(package):
    from stagevisor.stages.hibari.voice import Acoustic

    acoustic = Acoustic(threads=1)
    text = LONG + " Hi. Yes, of course! One two three four five six seven eight nine ten. I. Go!"
    for ps in package.phonemize(text):
        ids = package.ids(ps)
        for speed in (0.25, 1.0, 2.0, 4.0):
            frames = acoustic.frames(ids, speed)["f0"].shape[0]
            hint = hibari_stages.noise_frames_hint(len(ids), speed)
            assert hint <= frames
            if len(ids) >= 50 and speed == 1.0:  # the edges weigh little: all but about 10% drawn ahead
                assert frames <= 1.15 * hint


def test_the_engine_streams_each_sentence_as_spectral_frames_about_1_mb_per_audio_second(stages):
    pre, engine, _ = stages
    payload = StagePayload("r", request(LONG), {})
    data = asyncio.run(pre.process(payload, DriverContext("r", None, None, [])))
    chunks: list = []
    final = asyncio.run(
        engine.process(StagePayload("r", payload.request, data), DriverContext("r", None, None, chunks))
    )
    announcement, *chunks = chunks
    assert len(chunks) == len(data["phoneme_ids"]) == final["sentences"]
    # First, while the first sentence's acoustic pass runs: its seed and a little fewer than its frames.
    first_frames = chunks[0]["f0"].shape[0]
    assert announcement == {
        "seed": 0,
        "noise_frames": hibari_stages.noise_frames_hint(len(data["phoneme_ids"][0]), 1.0),
    }
    assert 0 < announcement["noise_frames"] <= first_frames
    for chunk in chunks:
        frames = chunk["f0"].shape[0]
        assert chunk["f0"].dtype == np.float32 and chunk["seed"] == 0
        for name in SPECTRAL_PARTS:
            assert chunk[name].dtype == np.float32 and chunk[name].shape == (BINS, frames)
    assert final["frames"] == sum(chunk["f0"].shape[0] for chunk in chunks)
    total = sum(sum(chunk[n].nbytes for n in (*SPECTRAL_PARTS, "f0")) for chunk in chunks)
    seconds = final["frames"] * 300 / SAMPLE_RATE
    assert 0.9e6 < total / seconds < 1.0e6  # 5 x 601 float32 + F0 per 12.5 ms frame: 961,920 bytes a second


def test_each_sentence_acoustic_pass_runs_beside_the_one_before_it_one_ahead_at_most(stages):
    from stagevisor.stages.compute import DeadlinePool
    from stagevisor.stages.hibari.voice import Acoustic

    real = Acoustic(threads=1)
    lock, running, most, order = threading.Lock(), [0], [0], []
    both = threading.Barrier(2, timeout=10)  # the first pass waits here until the second one runs beside it

    class Watched:
        def frames(self, ids: list[int], speed: float) -> dict[str, np.ndarray]:
            with lock:
                order.append(len(ids))
                running[0] += 1
                most[0] = max(most[0], running[0])
                first_two = len(order) <= 2
            try:
                if first_two:
                    both.wait()
                return real.frames(ids, speed)
            finally:
                with lock:
                    running[0] -= 1

    engine = hibari_stages.TtsEngine(Watched())  # type: ignore[arg-type]
    engine.pool = DeadlinePool(3)  # a free thread more than the engine may use
    pre = stages[0]
    payload = StagePayload("r", request(LONG), {})
    data = asyncio.run(pre.process(payload, DriverContext("r", None, None, [])))
    chunks: list = []
    final = asyncio.run(
        engine.process(StagePayload("r", payload.request, data), DriverContext("r", None, None, chunks))
    )
    assert order == [len(ids) for ids in data["phoneme_ids"]] and final["sentences"] == len(order) == 3
    assert most[0] == 2  # the next sentence's pass, never two ahead
    ours = [chunk["f0"] for chunk in chunks[1:]]
    assert [f0.tobytes() for f0 in ours] == [real.frames(ids, 1.0)["f0"].tobytes() for ids in data["phoneme_ids"]]


def test_the_engine_holds_no_streamed_sentence_frames_while_it_makes_the_rest(stages):
    import gc
    import weakref

    class Frames(dict):  # a dict that a weak reference can follow
        pass

    made: list[weakref.ref] = []
    held: list[int] = []

    class Tiny:
        def frames(self, ids: list[int], speed: float) -> dict[str, np.ndarray]:
            frames = Frames({name: np.zeros((BINS, 4), np.float32) for name in SPECTRAL_PARTS})
            frames["f0"] = np.zeros(4, np.float32)
            made.append(weakref.ref(frames))
            return frames

    class Counting(DriverContext):
        async def stream(self, chunk) -> None:
            gc.collect()
            held.append(sum(ref() is not None for ref in made))

    engine = hibari_stages.TtsEngine(Tiny())  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {n} is here." for n in range(12))
    payload = StagePayload("r", request(text), {})
    data = asyncio.run(stages[0].process(payload, DriverContext("r", None, None, [])))
    asyncio.run(engine.process(StagePayload("r", payload.request, data), Counting("r", None, None, [])))
    assert len(made) == 12 and len(held) == 13  # the announcement, then each sentence
    # The one being streamed, the ones queued ahead, and the one before it, which the event loop's last callback
    # may hold for a moment (with every pass kept to the request's end, 12 by the last sentence).
    assert max(held) <= 1 + hibari_stages.PASSES_AHEAD + 1


def test_a_later_sentence_pass_yields_to_first_audio_work_due_with_the_first_sentence(stages, monkeypatch):
    from stagevisor.stages.compute import DeadlinePool
    from stagevisor.stages.hibari.voice import Acoustic

    real, order = Acoustic(threads=1), []

    class Recorded:
        def frames(self, ids: list[int], speed: float) -> dict[str, np.ndarray]:
            order.append(f"sentence {data['phoneme_ids'].index(ids)}")
            return real.frames(ids, speed)

    engine = hibari_stages.TtsEngine(Recorded())  # type: ignore[arg-type]
    engine.pool = DeadlinePool(1)
    # The engine's arrival and the noise's deadline read one clock that stands still: on the real clock the noise,
    # due 10 ms after the first sentence's pass, came before it whenever this thread waited that long for a core.
    clock = FakeClock()
    monkeypatch.setattr(hibari_stages, "time", SimpleNamespace(monotonic=clock))
    release = threading.Event()
    engine.pool.submit(0.0, release.wait, 10)  # the only thread is busy until every call below is queued
    payload = StagePayload("r", request(LONG), {})
    data = asyncio.run(stages[0].process(payload, DriverContext("r", None, None, [])))

    async def request_and_noise_draw() -> None:
        engine_run = asyncio.ensure_future(
            engine.process(StagePayload("r", payload.request, data), DriverContext("r", None, None, []))
        )
        waited = time.monotonic() + 10
        while engine.pool.queued() < 2 and time.monotonic() < waited:  # the engine queues its first two passes
            await asyncio.sleep(0.01)
        assert engine.pool.queued() == 2
        # What the vocoder queues on the announcement: the first sentence's noise, due with its first audio.
        engine.pool.submit(clock() + hibari_stages.FIRST_AUDIO_SECONDS + 0.01, order.append, "noise")
        release.set()
        await engine_run

    asyncio.run(request_and_noise_draw())
    # LONG's first sentence is short (no lead): the second sentence's pass would otherwise be due with it.
    assert order == ["sentence 0", "noise", "sentence 1", "sentence 2"]


@pytest.mark.parametrize(
    "options, message, code, field",
    [
        ({"noise_scale": "0"}, "unknown option 'noise_scale'", "UNKNOWN_OPTION", "noise_scale"),
        ({"speed": "9"}, "option 'speed' must be a number in [0.25, 4]", "INVALID_OPTION", "speed"),
        ({"speed": "nan"}, "option 'speed' must be a number", "INVALID_OPTION", "speed"),
        ({"length_scale": "0"}, "option 'length_scale' must be a number", "INVALID_OPTION", "length_scale"),
        ({"speed": "1", "length_scale": "1"}, "not both", "CONFLICTING_OPTIONS", "length_scale"),
        ({"seed": "-1"}, "option 'seed' must be a whole number", "INVALID_OPTION", "seed"),
        ({"seed": "1.5"}, "option 'seed' must be a whole number", "INVALID_OPTION", "seed"),
        ({"seed": str(2**32)}, "option 'seed' must be a whole number", "INVALID_OPTION", "seed"),
        (
            {"seed": "²"},
            "option 'seed' must be a whole number",
            "INVALID_OPTION",
            "seed",
        ),  # isdigit() is true, int() cannot read it
        (
            {"seed": "١٢"},
            "option 'seed' must be a whole number",
            "INVALID_OPTION",
            "seed",
        ),  # Arabic-Indic digits: not what a client means
        (
            {"speed": "١"},
            "option 'speed' must be a number in [0.25, 4]",
            "INVALID_OPTION",
            "speed",
        ),  # float() reads them; the seed did not
        (
            {"length_scale": "0_1"},
            "option 'length_scale' must be a number",
            "INVALID_OPTION",
            "length_scale",
        ),  # float() reads 1.0
    ],
)
def test_bad_options_are_invalid_requests_naming_the_option_with_a_code(options, message, code, field):
    with pytest.raises(InvalidRequest, match=message.replace("[", r"\[").replace("(", r"\(")) as caught:
        parse_options(options)
    assert (caught.value.code, caught.value.field) == (code, field)


def test_a_seed_written_as_a_json_float_is_the_same_seed():
    # "7.0" was refused here while Qwen3-TTS and the HTTP API took it as 7.
    assert parse_options({"seed": "7.0"}) == parse_options({"seed": "7"}) == HibariOptions(speed=1.0, seed=7)
    assert parse_options({"seed": " 4294967295 "}).seed == 2**32 - 1


def test_the_request_seed_field_is_the_seed_unless_an_option_names_one_too():
    assert parse_options(None, 9).seed == 9
    assert parse_options({"speed": "1.5"}, 0) == HibariOptions(speed=1.5, seed=0)
    with pytest.raises(InvalidRequest, match="not both") as caught:
        parse_options({"seed": "1"}, 2)
    assert (caught.value.code, caught.value.field) == ("CONFLICTING_OPTIONS", "seed")


def test_length_scale_is_the_inverse_of_speed_and_defaults_are_repeatable():
    assert parse_options({"length_scale": "0.5"}) == HibariOptions(speed=2.0, seed=0)
    assert parse_options(None) == HibariOptions(speed=1.0, seed=0)
    assert parse_options({"seed": " 42 "}).seed == 42


@pytest.mark.parametrize("name", ["HEART", "Af_Heart", " Default\n"])
def test_the_voice_answers_to_its_names_in_any_case_as_over_http(stages, package, name):
    """HTTP matched `HEART` to the model's `heart` but the stage refused it, so gRPC and the CLI did."""
    audio = run_chain(stages, {**request(SHORT), "voice": name}).audio()
    assert audio.tobytes() == own_synthesis(package, SHORT).tobytes()


@pytest.mark.parametrize(
    "req, message, code, field",
    [
        (request(""), "text must be a non-empty string", "TEXT_EMPTY", "text"),
        (request("x" * (hibari_stages.Preprocessing.max_text_chars + 1)), "at most 5000", "TEXT_TOO_LONG", "text"),
        (request(" - "), "nothing speakable", "NOTHING_SPEAKABLE", "text"),
        # "" (no preference) was offered among the names: "the hibari voice answers to '', 'af_heart', ..."
        (
            {**request(SHORT), "voice": "alloy"},
            "voice 'alloy' is not available; the hibari voice answers to 'af_heart', 'default', 'heart'$",
            "UNKNOWN_VOICE",
            "voice",
        ),
        # The G2P's search over a word's pieces grows as their cube: 500 of these took 290 s, lock held.
        (request("well-" * 500), "cannot pronounce in reasonable time \\('well-well-", "TEXT_TOO_COMPLEX", "text"),
        (request("%" * 500), "cannot pronounce in reasonable time", "TEXT_TOO_COMPLEX", "text"),
        (
            request(" ".join(["a/" * 20] * 100)),
            "too many words joined from many pieces \\(such as 'a/a/",
            "TEXT_TOO_COMPLEX",
            "text",
        ),
        (request("a" + "\u0301" * 2000), "cannot pronounce in reasonable time", "TEXT_TOO_COMPLEX", "text"),
        # The package raises (ValueError, IndexError); the message named that, not the number at fault.
        (request("1" * 5000), "a number of 5000 digits \\('1111", "TEXT_UNREADABLE", "text"),
        (
            request("$" + "9" * 300 + ".99"),
            "a number of 302 digits \\('\\$999.*at most 36; write it in words",
            "TEXT_UNREADABLE",
            "text",
        ),
        # Pauses only: they were spoken as near-silence (0.75 s for "...!!!???"), script it cannot read as 0.4 s.
        (request("...!!!???"), "nothing speakable", "NOTHING_SPEAKABLE", "text"),
        (request("مرحبا بالعالم."), "nothing speakable", "NOTHING_SPEAKABLE", "text"),
        # It used to speak such a request in its own voice, as if the reference had been used.
        (
            {**request(SHORT), "reference_audio": b"RIFF"},
            "cannot clone a voice from reference audio; drop",
            "CLONING_NOT_SUPPORTED",
            "reference_audio",
        ),
    ],
)
def test_bad_requests_fail_in_preprocessing_with_a_clear_message_a_code_and_the_field(
    stages, req, message, code, field
):
    """Only NOTHING_SPEAKABLE carried a code and a field: the other refusals of the text reached a client as a bare
    INVALID_ARGUMENT, with `param` null over HTTP."""
    with pytest.raises(InvalidRequest, match=message) as caught:
        run_chain(stages, req)
    assert (caught.value.code, caught.value.field) == (code, field)


def test_pauses_before_the_first_sound_are_held_and_handed_on_with_it_as_the_package_speaks_them(stages, package):
    """A text whose chunks are all pauses is refused before any is handed on; pauses before speech are kept."""
    text = "...!!! Hello there."
    assert run_chain(stages, request(text)).audio().tobytes() == own_synthesis(package, text).tobytes()


@pytest.mark.parametrize(
    "text",
    [
        "Hello there. " + "1" * 40 + " apples.",  # the package's number reader has no words past decillion
        "Fine. Still fine! And now $" + "9" * 50 + ".",
        "One. Two.\n\nThree " + "1'" * 40 + "1.",
    ],
)
def test_a_later_sentence_the_g2p_cannot_read_is_refused_before_the_first_is_handed_on(stages, text):
    ctx = DriverContext("r", None, None, [])
    with pytest.raises(InvalidRequest, match="the voice's G2P cannot read this text"):
        asyncio.run(stages[0].process(StagePayload("r", request(text), {}), ctx))
    assert ctx.streamed == 0


@pytest.mark.parametrize(
    "text",
    [
        "An ID: " + "1" * 36 + ". Next.",
        "Pi is 3." + "1" * 60 + ", more or less.",
        "Words " + "1 " * 60 + "done.",
        "A year, 2024, and 1,250 people paid $9.99 at 7:30 pm.",
    ],
)
def test_numbers_the_g2p_reads_are_not_refused(stages, text):
    assert run_chain(stages, request(text), stream_edges=DEMO_EDGES).audio().size > 0


def test_the_g2p_work_of_prose_is_far_under_the_budget_and_a_long_joined_run_is_far_over():
    prose = "The quick brown fox, jumps over the lazy dog's back: state-of-the-art, 3.5% at https://example.com/a/b. "
    assert g2p_work(prose * 45, SUBTOKEN_RE)[0] < G2P_BUDGET // 5  # 5000 characters, a URL in every sentence
    work, word, word_work = g2p_work("fine words " + "a/" * 100 + " more", SUBTOKEN_RE)
    assert work > G2P_BUDGET and word == "a/" * 100 and word_work == 200**3


def test_speed_and_length_scale_take_either_end_of_their_range():
    assert parse_options({"speed": "0.25"}).speed == 0.25 and parse_options({"speed": "4"}).speed == 4.0
    assert parse_options({"length_scale": "4"}).speed == 0.25 and parse_options({"length_scale": "0.25"}).speed == 4.0


def test_options_default_to_the_package_pace_and_are_fixed_once_made():
    import dataclasses

    assert HibariOptions() == parse_options({}) == HibariOptions(speed=1.0, seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        HibariOptions().speed = 2.0  # type: ignore[misc]


def test_of_several_unknown_options_the_first_in_order_is_named():
    with pytest.raises(InvalidRequest, match="unknown option 'alpha'"):
        parse_options({"zeta": "1", "alpha": "2"})


def test_the_voice_is_described_with_its_other_names():
    from stagevisor.stages.hibari.voice import describe_voice

    assert describe_voice() == {
        "id": "heart",
        "name": "heart",
        "language": "en_US",
        "sample_rate": 24000,
        "aliases": ["af_heart", "default"],
    }


def test_the_voice_frame_and_rate_are_the_package_ones():
    from hibari import dsp

    from stagevisor.stages.hibari.voice import HOP_SAMPLES, SAMPLE_RATE

    assert (HOP_SAMPLES, SAMPLE_RATE) == (dsp.HOP, dsp.SR)


def test_the_acoustic_session_runs_on_one_thread_unless_told(monkeypatch):
    from stagevisor.stages.hibari.voice import ort_threads

    monkeypatch.delenv("STAGEVISOR_ORT_THREADS", raising=False)
    assert ort_threads() == 1
    monkeypatch.setenv("STAGEVISOR_ORT_THREADS", "2")
    assert ort_threads() == 2


def test_the_g2p_phonemizer_and_acoustic_model_are_built_once_per_process():
    from stagevisor.stages.hibari import voice

    assert voice.shared_g2p() is voice.shared_g2p()
    assert voice.load_phonemizer() is voice.load_phonemizer()
    assert voice.load_acoustic() is voice.load_acoustic()


def test_loading_the_voice_without_its_package_names_the_extra_to_install(monkeypatch):
    from stagevisor.stages import extras
    from stagevisor.stages.hibari import voice

    monkeypatch.setattr(extras.missing_extras, "__defaults__", (lambda module: module != "hibari",))
    for load in (voice.load_phonemizer, voice.load_acoustic):
        with pytest.raises(ImportError, match=r"\[demo\]"):
            load.__wrapped__()  # the cached loader's own body, as a process without hibari runs it


def test_the_g2p_reads_american_english_as_the_voice_does():
    from hibari.g2p import G2P

    from stagevisor.stages.hibari.voice import shared_g2p

    # The loader's own body (not its process-wide cache, which an earlier test filled): what a new process builds.
    assert shared_g2p.__wrapped__()("tomato") == G2P(british=False)("tomato") != G2P(british=True)("tomato")


def test_the_g2p_work_names_the_first_word_that_asks_most():
    assert g2p_work("a b", SUBTOKEN_RE) == (2, "a", 1)
    assert g2p_work("a-b c-d", SUBTOKEN_RE) == (54, "a-b", 27)


def test_the_longest_number_counts_the_digits_of_one_word():
    from stagevisor.stages.hibari.voice import longest_number

    assert longest_number("") == 0 and longest_number("no digits") == 0
    assert longest_number("paid 1,250 at 7:30") == 4


def test_a_text_at_the_g2p_budget_is_read_and_one_piece_more_is_refused():
    phonemizer = load_phonemizer()
    joined = "a-" * 50  # 100 pieces: 100 ** 3 is the budget exactly
    assert g2p_work(joined, SUBTOKEN_RE)[0] == G2P_BUDGET
    assert phonemizer.sentences(joined) == [joined]
    with pytest.raises(InvalidRequest, match="too many words joined from many pieces"):
        phonemizer.sentences(joined + " b")
    with pytest.raises(InvalidRequest, match="has a word the voice cannot pronounce"):
        phonemizer.sentences(joined + "a")


@pytest.mark.parametrize(("word", "shown"), [("a-" * 20, "a-" * 20), ("a-" * 20 + "a", "a-" * 20 + "...")])
def test_a_refused_word_is_shown_whole_up_to_40_characters(word, shown):
    with pytest.raises(InvalidRequest) as refused:
        load_phonemizer().sentences(" ".join([word] * 16))  # 16 words of 40 or 41 pieces: over the budget
    assert f"(such as {shown!r})" in str(refused.value)


def test_a_number_one_digit_longer_than_the_package_reads_is_refused_before_any_sentence():
    from stagevisor.stages.hibari.voice import Phonemizer

    phonemizer = Phonemizer()  # a new one, as a new process builds it (load_phonemizer's is cached)
    assert phonemizer.readable_digits == 36
    with pytest.raises(InvalidRequest, match="the voice's G2P cannot read this text"):
        phonemizer.sentences("Fine. The number " + "1" * 37 + " is long.")


@pytest.mark.parametrize("length", [0, 1, 400, 800])
def test_a_chunk_up_to_the_cap_is_kept_whole(length):
    chunk = ("ab " * length)[:length]
    assert cut_long_chunk(chunk, 800, 400) == [list(chunk)]


def test_a_chunk_over_the_cap_is_cut_at_spaces_into_pieces_of_at_most_the_package_size():
    words = [f"w{i}" + "x" * (i % 7) for i in range(400)] + ["y" * 950]  # a last "word" longer than a piece
    chunks = ["".join(chunk) for chunk in cut_long_chunk(" ".join(words), 800, 400)]
    assert all(0 < len(chunk) <= 400 for chunk in chunks) and len(chunks) > 3
    assert "".join(chunks).replace(" ", "") == "".join(words)  # nothing lost, nothing added but the cuts
    assert all(chunk == chunk.strip() for chunk in chunks)


def test_a_cut_keeps_multi_character_symbols_whole():
    symbols = ["ts", "a", " ", "ʃː", "o"] * 300
    chunks = cut_long_chunk(symbols, 800, 400)
    assert [s for chunk in chunks for s in chunk if s != " "] == [s for s in symbols if s != " "]


def test_unpunctuated_text_is_spoken_in_chunks_the_acoustic_model_takes_in_bounded_time(stages, package):
    text = "the quick brown fox jumps over the lazy dog and then it runs far away " * 30
    assert max(len(ps) for ps in package.phonemize(text)) > MAX_CHUNK_PHONEMES  # the package makes one huge chunk
    result = run_chain(stages, request(text))
    ids = result.finals[0]["phoneme_ids"]
    assert len(ids) > 1 and max(len(chunk) for chunk in ids) <= 400 + 2  # the package's MAX_PHONEMES, plus pads
    assert result.audio().size > 0


def test_the_voice_answers_to_its_names(stages):
    assert stages[0].voices[0]["id"] == "heart" and stages[0].voices[0]["sample_rate"] == 24000
    for name in ("heart", "af_heart", "default", ""):
        assert run_chain(stages, {**request(SHORT), "voice": name}).audio().size > 0


def test_the_engine_refuses_a_payload_without_a_prepared_request(stages):
    with pytest.raises(StageError, match="received no prepared request"):
        asyncio.run(stages[1].process(StagePayload("r", request(SHORT), {}), DriverContext("r", None, None, [])))


async def _vocode(vocoder, chunks: list) -> dict:
    inbox: asyncio.Queue = asyncio.Queue()
    for chunk in chunks:
        inbox.put_nowait(chunk)
    inbox.put_nowait(END)
    return await vocoder.process(StagePayload("r", request(SHORT), {}), DriverContext("r", inbox, None, []))


@pytest.mark.parametrize(
    "chunk, message",
    [
        ({"latent": np.zeros((192, 4), np.float32)}, "neither hibari's acoustic frames nor"),
        ({"seed": 0, "noise_frames": "many"}, "neither hibari's acoustic frames nor"),
        ({"seed": 2**32, "noise_frames": 10}, "seed 4294967296"),
        ({"seed": -1, "noise_frames": 10}, "seed -1"),
        ({"seed": 0}, "neither hibari's acoustic frames nor"),  # KeyError: no noise_frames
        ({"seed": None, "noise_frames": 10}, "neither hibari's acoustic frames nor"),  # TypeError
        ({"seed": "x", "noise_frames": 10}, "neither hibari's acoustic frames nor"),  # ValueError
        (
            {**{n: np.zeros((BINS, 4), np.float32) for n in SPECTRAL_PARTS}, "f0": np.zeros(5, np.float32), "seed": 0},
            "shape",
        ),
        (
            {**{n: np.zeros((BINS, 4), np.float32) for n in SPECTRAL_PARTS}, "f0": np.zeros(4, np.float32), "seed": -1},
            "seed -1",
        ),
    ],
)
def test_the_vocoder_refuses_chunks_that_are_not_acoustic_frames(stages, chunk, message):
    with pytest.raises(StageError, match=message):
        asyncio.run(_vocode(stages[2], [chunk]))


def test_the_vocoder_clips_loud_audio_to_the_stage_contract_range(stages):
    """Every audio chunk of the Stage contract lies in [-1, 1]: frames loud enough to go past it come out clipped."""
    frames = synthetic_frames(40, seed=3)
    frames["lh"] = np.full((BINS, 40), 6.0, np.float32)  # a harmonic branch far louder than speech
    inbox: asyncio.Queue = asyncio.Queue()
    for chunk in ({**frames, "seed": 0}, END):
        inbox.put_nowait(chunk)
    streamed: list = []
    asyncio.run(stages[2].process(StagePayload("r", request(SHORT), {}), DriverContext("r", inbox, None, streamed)))
    audio = np.concatenate([chunk["audio"] for chunk in streamed])
    assert audio.max() == 1.0 and audio.min() == -1.0


@pytest.mark.parametrize(
    "chunk",
    [
        {"seed": 0, "noise_frames": 10},  # a second announcement: no frames (KeyError)
        {**{n: np.zeros((BINS, 4), np.float32) for n in SPECTRAL_PARTS}, "f0": np.zeros(4, np.float32)},  # no seed
        "frames",  # not a mapping (TypeError)
        {**{n: np.zeros((BINS, 4), np.float32) for n in SPECTRAL_PARTS}, "f0": np.zeros(4, np.float32), "seed": "x"},
    ],
)
def test_after_the_announcement_a_chunk_without_acoustic_frames_is_refused(stages, chunk):
    with pytest.raises(StageError, match="received a chunk without hibari's acoustic frames"):
        asyncio.run(_vocode(stages[2], [{"seed": 0, "noise_frames": 10}, chunk]))


def test_a_vocoder_that_received_nothing_fails_the_request(stages):
    with pytest.raises(StageError, match="received no acoustic frames"):
        asyncio.run(_vocode(stages[2], []))


def test_a_vocoder_cancelled_after_its_first_audio_drops_the_runs_it_queued(package, monkeypatch):
    from stagevisor.stages.compute import DeadlinePool
    from stagevisor.stages.hibari import render
    from stagevisor.stages.hibari.voice import Acoustic

    computed: list[tuple[int, int]] = []
    real_compute = render.SentenceRenderer.compute

    def recorded(self, start: int, end: int) -> None:
        computed.append((start, end))
        real_compute(self, start, end)

    vocoder = hibari_stages.Vocoder()  # its DSP warm-up (a first and a later run) before counting
    vocoder.pool = DeadlinePool(1)
    monkeypatch.setattr(render.SentenceRenderer, "compute", recorded)
    frames = Acoustic(threads=1).frames(package.ids(package.phonemize(LONG)[1]), 1.0)
    release = threading.Event()
    real_first_run = hibari_stages._first_run

    def first_run(*args):
        # Queued from the pool's one thread before the later runs exist, and due before them: the thread
        # takes it next and is busy until the first audio has been handed on (no race with the later runs).
        vocoder.pool.submit(0.0, release.wait, 10)
        return real_first_run(*args)

    monkeypatch.setattr(hibari_stages, "_first_run", first_run)

    async def vocode() -> tuple[dict, DriverContext]:
        inbox: asyncio.Queue = asyncio.Queue()
        ctx = DriverContext("r", inbox, None, [])
        ctx.cancel_after_chunks = 1
        for chunk in ({**frames, "seed": 0}, {**frames, "seed": 0}, END):  # a second sentence is never rendered
            inbox.put_nowait(chunk)
        real_stream = ctx.stream

        async def stream(chunk):
            await real_stream(chunk)
            release.set()

        ctx.stream = stream  # type: ignore[method-assign]
        return await vocoder.process(StagePayload("r", request(LONG), {}), ctx), ctx

    final, ctx = asyncio.run(vocode())
    assert ctx.streamed == 1 and final["samples"] == 14 * 300 and final["sentences"] == 0
    waited = time.monotonic() + 10
    while vocoder.pool.queued() and time.monotonic() < waited:  # the pool's thread drops what was cancelled
        time.sleep(0.01)
    assert vocoder.pool.queued() == 0 and computed == [(0, 16)]  # every later run dropped before it started


def test_a_cancelled_request_stops_after_the_sentence_in_hand(stages):
    pre, engine, _ = stages
    payload = StagePayload("r", request(LONG), {})
    data = asyncio.run(pre.process(payload, DriverContext("r", None, None, [])))
    ctx = DriverContext("r", None, None, [])
    ctx.cancel_after_chunks = 2  # the first sentence's announcement, then its frames
    final = asyncio.run(engine.process(StagePayload("r", payload.request, data), ctx))
    assert ctx.streamed == 2 and final["sentences"] == 3


SENTENCE_TEXTS = [
    LONG,
    "Dr. Smith met J. K. Rowling at 3 p.m. on Main St. yesterday. Then they left!",
    'He said "hi." Then he left. (Really.) [Yes.] Okay… fine? Sure!',
    "Hi.\tDr. Smith is here. Mr.\u00a0Jones too. e.g. this one. i.e. that.",
    "First line\nSecond line.\n\n  Third paragraph.   Fourth sentence here.\r\nFifth.",
    "lowercase after a period. like this. And Capital. a. B. C.",
    "Numbers: 1. 2. 3. The 1990s. $1,000,000.00! 50% off. 12:30. 3.14159.",
    "the quick brown fox jumps over the lazy dog and then it runs far away " * 30,
    "Wait... what?! No way!!! 'Quoted.' “Curly.” ‘Single.’ —dash. Done",
    "  leading and trailing spaces.   ",
    "Symbols & more: a/b, c-d, e_f, g@h.com, https://example.com/a. Emoji 😀. Café. Naïve.",
]


def _random_text(rng) -> str:
    words = [
        "Dr.",
        "Mr.",
        "St.",
        "J.",
        "K.",
        "U.S.",
        "e.g.",
        "etc.",
        "Hello",
        "world",
        "the",
        "cat",
        "3.5",
        "1,250",
        "$9.99",
        "2024",
        "ok",
        "Yes",
        "no",
        "\u2026",
        "!",
        "?",
        ".",
        '"',
        "\u201d",
        ")",
        "(",
        "-",
        "\n",
        "\n\n",
        "\t",
        "a.",
        "B.",
        "it's",
        "I",
        "x",
    ]
    return " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))


def test_the_text_read_a_sentence_at_a_time_gives_the_package_phonemes_of_the_whole_text(package):
    """The package phonemizes each of its split_sentences on its own (Hibari.phonemize), and a sentence it split
    out splits into itself again: so a sentence at a time is the whole text's phonemes, chunk for chunk."""
    import random

    from stagevisor.stages.hibari.voice import load_phonemizer

    phonemizer = load_phonemizer()
    rng = random.Random(0)
    for text in SENTENCE_TEXTS + [_random_text(rng) for _ in range(200)]:
        sentences = package.split_sentences(text)
        assert all(package.split_sentences(sentence) == [sentence] for sentence in sentences), text
        assert [ps for sentence in sentences for ps in package.phonemize(sentence)] == package.phonemize(text), text
        assert phonemizer.sentences(text) == sentences
        whole = [package.ids(ps) for ps in package.phonemize(text)]
        if max((len(ids) for ids in whole), default=0) <= MAX_CHUNK_PHONEMES:  # longer: cut at words (above)
            assert [ids for s in sentences for ids in phonemizer.sentence_ids(s)] == [i for i in whole if len(i) >= 3]


class _Recorded:
    """The process's Phonemizer, recording each sentence it reads; `hold` blocks the G2P of sentence `held_at`
    (the last by default)."""

    def __init__(self, hold: threading.Event | None = None, held_at: int = -1) -> None:
        from stagevisor.stages.hibari.voice import load_phonemizer

        self.real = load_phonemizer()
        self.hold = hold
        self.held_at = held_at
        self.read: list[str] = []
        self.held: bool | None = None

    def sentences(self, text: str) -> list[str]:
        self.all = self.real.sentences(text)
        return self.all

    def sentence_ids(self, sentence: str) -> list[list[int]]:
        if self.hold is not None and sentence == self.all[self.held_at]:
            self.held = self.hold.wait(10)  # False: nothing came of the first sentence while we waited
        self.read.append(sentence)
        return self.real.sentence_ids(sentence)

    def phoneme_ids(self, text: str) -> list[list[int]]:
        return [ids for sentence in self.sentences(text) for ids in self.sentence_ids(sentence)]

    def silent(self, ids: list[int]) -> bool:
        return self.real.silent(ids)


@pytest.mark.parametrize("held_at", [-1, 1], ids=["the last sentence", "the next sentence"])
def test_the_engine_makes_the_first_sentence_before_the_g2p_reads_the_rest(stages, package, held_at):
    """The first sentence's frames leave while the G2P of a later one is held: the last, and the very next one
    (the engine looks one sentence ahead to queue its pass, but never waits for it before streaming)."""
    first_frames = threading.Event()
    phonemizer = _Recorded(hold=first_frames, held_at=held_at)

    class Signalling(DriverContext):
        async def stream(self, chunk) -> None:
            if "f0" in chunk:
                first_frames.set()
            await super().stream(chunk)

    pre = hibari_stages.Preprocessing(phonemizer)  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {n} is here." for n in range(6))

    async def chain() -> list:
        queue: asyncio.Queue = asyncio.Queue(maxsize=8)
        sink: list = []
        engine_ctx = Signalling("r", queue, None, sink)
        engine = asyncio.ensure_future(stages[1].process(StagePayload("r", request(text), {}), engine_ctx))
        await pre.process(StagePayload("r", request(text), {}), DriverContext("r", None, queue, []))
        await queue.put(END)
        await engine
        return sink

    chunks = asyncio.run(chain())
    assert phonemizer.held is True  # the first sentence's frames came while the last one was not yet read
    assert len(chunks) == 1 + 6  # the announcement, then every sentence's frames
    assert run_chain(stages, request(text), stream_edges=DEMO_EDGES).audio().tobytes() == (
        own_synthesis(package, text).tobytes()
    )


def test_a_cancelled_request_reads_no_more_sentences(stages):
    phonemizer = _Recorded()
    pre = hibari_stages.Preprocessing(phonemizer)  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {n} is here." for n in range(6))
    ctx = DriverContext("r", None, None, [])
    ctx.cancel_after_chunks = 1
    asyncio.run(pre.process(StagePayload("r", request(text), {}), ctx))
    assert ctx.streamed == 1 and len(phonemizer.read) == 1


def test_a_cancelled_preprocessing_task_stops_the_g2p_of_later_sentences(stages):
    # The second sentence's G2P is held until the task is cancelled: without the hold, a loaded machine could let
    # the G2P thread finish it and start a third before this test's task ran to cancel (a flaky failure).
    cancelled = threading.Event()
    phonemizer = _Recorded(hold=cancelled, held_at=1)
    pre = hibari_stages.Preprocessing(phonemizer)  # type: ignore[arg-type]
    text = " ".join(f"Sentence number {n} is here." for n in range(20))

    async def cancel_after_the_first_sentence() -> None:
        queue: asyncio.Queue = asyncio.Queue(maxsize=8)
        task = asyncio.ensure_future(
            pre.process(StagePayload("r", request(text), {}), DriverContext("r", None, queue, []))
        )
        await asyncio.wait_for(queue.get(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled.set()

    asyncio.run(cancel_after_the_first_sentence())
    # The first, and the second if its G2P thread had started when the task was cancelled: never a third.
    assert phonemizer.read in (phonemizer.all[:1], phonemizer.all[:2])


def test_a_later_sentence_the_g2p_fails_on_ends_the_request_after_the_first_is_handed_on(stages):
    """No built-in voice is known to fail so; if one does, the request ends with INVALID_ARGUMENT mid-stream."""

    class FailsOnTheThird(_Recorded):
        def sentence_ids(self, sentence: str) -> list[list[int]]:
            if len(self.read) == 2:
                raise InvalidRequest("the voice's G2P cannot read this text (IndexError)")
            return super().sentence_ids(sentence)

    pre = hibari_stages.Preprocessing(FailsOnTheThird())  # type: ignore[arg-type]
    ctx = DriverContext("r", None, None, [])
    with pytest.raises(InvalidRequest, match="cannot read"):
        asyncio.run(pre.process(StagePayload("r", request("One here. Two here. Three here."), {}), ctx))
    assert ctx.streamed == 2


class HeldPool:
    """A compute pool whose thread is busy after its first `runs` calls: those run at submission, the rest stay
    queued (their futures pending), as behind other requests' work."""

    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.futures: list[concurrent.futures.Future] = []

    def submit(self, deadline: float, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if len(self.futures) < self.runs:
            future.set_result(fn(*args))
        self.futures.append(future)
        return future


def _early_end(queued: list[dict], cancel_after_chunks: int) -> tuple[dict, HeldPool, list[asyncio.Task]]:
    """The engine behind a sentence stream holding `queued` chunks (and never its end), cancelled after it has
    streamed `cancel_after_chunks`: its final data, its pool, and the tasks left in the loop once it returned."""
    engine = hibari_stages.TtsEngine(hibari_stages.load_acoustic())
    pool = engine.pool = HeldPool(runs=1)  # type: ignore[assignment]

    async def speak() -> tuple[dict, list[asyncio.Task]]:
        inbox: asyncio.Queue = asyncio.Queue()
        for chunk in queued:
            inbox.put_nowait(chunk)
        ctx = DriverContext("r", inbox, None, [])
        ctx.cancel_after_chunks = cancel_after_chunks
        final = await asyncio.wait_for(engine.process(StagePayload("r", request(LONG), {}), ctx), 10)
        return final, [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]

    final, left = asyncio.run(speak())
    return final, pool, left


def _sentence_chunks(text: str) -> list[dict]:
    ids = load_phonemizer().phoneme_ids(text)
    return [{"phoneme_ids": [one], "options": {"speed": 1.0, "seed": 0}} for one in ids]


def test_an_engine_cancelled_while_it_waits_for_the_next_sentence_stops_reading_and_returns():
    """The look-ahead read of the next sentence's ids is cancelled before the stream is closed (a generator cannot
    close while a read of it runs) and its cancellation is not the engine's: the engine returns its data."""
    first, *_ = _sentence_chunks(LONG)
    final, pool, left = _early_end([first], cancel_after_chunks=2)  # the announcement, then the frames
    assert final["sentences"] == 1 and final["frames"] > 0
    assert len(pool.futures) == 1 and left == []  # no read of the stream left waiting for a sentence


def test_an_engine_cancelled_after_a_sentence_drops_the_acoustic_passes_it_queued_ahead():
    chunks = _sentence_chunks(LONG)
    assert len(chunks) == 3
    final, pool, left = _early_end(chunks, cancel_after_chunks=2)
    assert final["sentences"] >= 2 and left == []
    first, *queued = pool.futures
    assert first.done() and not first.cancelled()
    assert queued and all(future.cancelled() for future in queued)  # not started: dropped, never run


def test_the_largest_seed_speaks_as_the_package_does(stages, package):
    audio = run_chain(stages, request(SHORT, seed=2**32 - 1), stream_edges=DEMO_EDGES).audio()
    assert audio.tobytes() == own_synthesis(package, SHORT, seed=2**32 - 1).tobytes()
