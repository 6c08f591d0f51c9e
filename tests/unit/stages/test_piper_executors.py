"""The piper model's executors (the Piper voice, `piper` extra), run as a chain in one event loop by the driver."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from stagevisor.stages.piper import executors as demo
from stagevisor.stages.base import InvalidRequest, StageError, StagePayload
from stagevisor.stages.compute import compute_pool
from stagevisor.stages.piper.chunked import ChunkedDecoder
from stagevisor.stages.piper.options import SynthesisOptions
from tests.unit.stage_driver import PIPER_NOISELESS, DriverContext, request, run_chain, run_chain_async

SHORT = "Hello there."
LONG = "Hello there. The weather today is bright and clear, with a gentle breeze from the west."


@pytest.fixture(scope="module")
def stages():
    return [demo.preprocessing(), demo.tts_engine(), demo.vocoder()]


# One noiseless run of each text for the module: the tests that only read its audio, chunks and finals share it
# (a run of LONG takes about a second of CPU); a test that compares two runs still makes its second one.
@pytest.fixture(scope="module")
def short_noiseless(stages):
    return run_chain(stages, request(SHORT, **PIPER_NOISELESS))


@pytest.fixture(scope="module")
def long_noiseless(stages):
    return run_chain(stages, request(LONG, **PIPER_NOISELESS))


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))


def test_demo_chain_makes_non_silent_audio_at_the_voice_rate(stages):
    result = run_chain(stages, request(SHORT))
    assert result.sample_rate == 22050
    assert result.audio().shape[0] > 22050 // 4
    assert rms(result.audio()) > 0.01


def test_audio_chunks_are_float32_mono_within_unit_range(long_noiseless):
    for chunk in long_noiseless.chunks:
        assert chunk["audio"].dtype == np.float32 and chunk["audio"].ndim == 1
        assert np.abs(chunk["audio"]).max() <= 1.0


def test_audio_streams_in_several_chunks_for_a_long_text(long_noiseless):
    assert len(long_noiseless.chunks) >= 3  # streamed: one chunk per decode window, never one for the whole text


def test_duration_grows_with_text_length(short_noiseless, long_noiseless):
    short, long = short_noiseless.audio(), long_noiseless.audio()
    assert long.shape[0] > 2 * short.shape[0]


def test_audio_is_bit_identical_run_to_run_with_noise_off(stages, long_noiseless):
    first = long_noiseless.audio()
    second = run_chain(stages, request(LONG, **PIPER_NOISELESS)).audio()
    assert first.tobytes() == second.tobytes()


def test_length_scale_slows_speech_down(stages, short_noiseless):
    normal = short_noiseless.audio()
    slow = run_chain(stages, request(SHORT, length_scale=2, **PIPER_NOISELESS)).audio()
    assert slow.shape[0] > 1.6 * normal.shape[0]


def test_streamed_audio_matches_decoding_the_whole_latent_at_once(stages, long_noiseless):
    voice = stages[0].voice
    quiet = SynthesisOptions(0.0, 0.0, 1.0)
    latent = np.concatenate([voice.acoustic(ids, quiet) for ids in voice.phoneme_ids(LONG)], axis=1)
    whole = voice.decode(latent)
    streamed = long_noiseless.audio()
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() / np.abs(whole).max() < 1e-5


def test_final_data_reports_frames_and_samples(short_noiseless):
    result = short_noiseless
    engine_final, vocoder_final = result.finals[1], result.finals[2]
    assert vocoder_final["frames"] == engine_final["frames"] > 0
    assert vocoder_final["samples"] == result.audio().shape[0] == 256 * engine_final["frames"]


@pytest.mark.parametrize(
    "text, code",
    [
        ("", "TEXT_EMPTY"),
        ("   ", "TEXT_EMPTY"),
        (None, "TEXT_EMPTY"),
        ("x" * (demo.Preprocessing.max_text_chars + 1), "TEXT_TOO_LONG"),
    ],
)
def test_missing_blank_or_oversized_text_is_an_invalid_request_naming_the_text(stages, text, code):
    with pytest.raises(InvalidRequest, match="text") as caught:
        run_chain(stages, {**request("x"), "text": text})
    assert (caught.value.code, caught.value.field) == (code, "text")


def test_text_with_nothing_speakable_is_an_invalid_request(stages):
    with pytest.raises(InvalidRequest, match="nothing speakable"):
        run_chain(stages, request("...!?"))


@pytest.mark.parametrize(
    "options, code, field",
    [
        ({"pitch": 3}, "UNKNOWN_OPTION", "pitch"),
        ({"noise_w": "loud"}, "INVALID_OPTION", "noise_w"),
        ({"length_scale": "9"}, "INVALID_OPTION", "length_scale"),
    ],
)
def test_a_bad_option_is_rejected_by_preprocessing_naming_it_with_a_code(stages, options, code, field):
    with pytest.raises(InvalidRequest, match=f"'{field}'") as caught:
        run_chain(stages, request(SHORT, **options))
    assert (caught.value.code, caught.value.field) == (code, field)


@pytest.mark.parametrize("name", ["", "default", "joe", "en_US-joe-medium", "JOE", " Default\n"])
def test_the_embedded_voice_is_selected_by_its_names(stages, short_noiseless, name):
    default = short_noiseless.audio()
    named = run_chain(stages, {**request(SHORT, **PIPER_NOISELESS), "voice": name}).audio()
    assert named.tobytes() == default.tobytes()


def test_reference_audio_is_refused_not_spoken_in_the_embedded_voice(stages):
    with pytest.raises(
        InvalidRequest, match="cannot clone a voice from reference audio; drop reference_audio"
    ) as caught:
        run_chain(stages, {**request(SHORT), "reference_audio": b"RIFF"})
    assert (caught.value.code, caught.value.field) == ("CLONING_NOT_SUPPORTED", "reference_audio")


def test_an_unknown_voice_is_an_invalid_request_listing_the_available_names(stages):
    with pytest.raises(InvalidRequest, match="en_US-joe-medium") as caught:
        run_chain(stages, {**request(SHORT), "voice": "alloy"})
    assert (caught.value.code, caught.value.field) == ("UNKNOWN_VOICE", "voice")


def test_vocoder_decodes_a_whole_latent_handed_over_in_data(stages):
    """An engine wired by a plain `next` edge returns the whole latent: same audio as streamed."""
    voice = stages[0].voice
    (ids,) = voice.phoneme_ids(LONG.split(". ")[1])
    latent = voice.acoustic(ids, SynthesisOptions(0.0, 0.0, 1.0))
    decoder = ChunkedDecoder(voice.decode)
    pieces = []
    for i in range(0, latent.shape[1], demo.LATENT_CHUNK_FRAMES):
        pieces += decoder.push(latent[:, i : i + demo.LATENT_CHUNK_FRAMES])
    streamed = np.clip(np.concatenate(pieces + decoder.finish()), -1, 1)
    ctx = DriverContext("r", None, None, sink := [])
    final = asyncio.run(stages[2].process(StagePayload("r", request("x"), {"latent": latent}), ctx))
    audio = np.concatenate([c["audio"] for c in sink])
    assert final["frames"] == latent.shape[1]
    assert audio.shape[0] == latent.shape[1] * 256
    assert audio.tobytes() == streamed.tobytes()


def test_vocoder_without_any_latent_fails_the_request_naming_the_stage(stages):
    ctx = DriverContext("r", None, None, [])
    with pytest.raises(StageError, match="'vocoder'"):
        asyncio.run(stages[2].process(StagePayload("r", request("x"), {}), ctx))


def test_engine_without_a_prepared_request_fails_naming_the_stage(stages):
    with pytest.raises(StageError, match="'tts_engine'"):
        run_chain(stages[1:], request(SHORT))


def test_engine_stops_streaming_once_the_request_is_cancelled(stages):
    async def scenario():
        prepared = await stages[0].process(StagePayload("r", request(LONG), {}), DriverContext("r", None, None, []))
        sink: list = []
        ctx = DriverContext("r", None, None, sink)
        ctx.cancel_after_chunks = 2
        final = await stages[1].process(StagePayload("r", request(LONG), prepared), ctx)
        return sink, final

    sink, final = asyncio.run(scenario())
    assert len(sink) == 2
    assert final["frames"] == sum(c["latent"].shape[1] for c in sink)


def test_factories_build_the_three_stages():
    assert isinstance(demo.preprocessing(), demo.Preprocessing)
    assert isinstance(demo.tts_engine(), demo.TtsEngine)
    assert isinstance(demo.vocoder(), demo.Vocoder)


def test_concurrent_requests_in_one_worker_keep_their_own_audio(stages, short_noiseless, long_noiseless):
    async def both():
        return await asyncio.gather(
            run_chain_async(stages, request(SHORT, **PIPER_NOISELESS)),
            run_chain_async(stages, request(LONG, **PIPER_NOISELESS)),
        )

    short, long = asyncio.run(both())
    # each as it sounds when run alone
    assert short.audio().tobytes() == short_noiseless.audio().tobytes()
    assert long.audio().tobytes() == long_noiseless.audio().tobytes()


def test_engine_streams_float32_latent_chunks_of_at_most_the_chunk_size(stages):
    async def scenario():
        prepared = await stages[0].process(StagePayload("r", request(LONG), {}), DriverContext("r", None, None, []))
        sink: list = []
        await stages[1].process(StagePayload("r", request(LONG), prepared), DriverContext("r", None, None, sink))
        return sink

    chunks = asyncio.run(scenario())
    assert len(chunks) > 2
    for chunk in chunks:
        latent = chunk["latent"]
        assert latent.dtype == np.float32 and latent.shape[0] == 192
        assert 0 < latent.shape[1] <= demo.LATENT_CHUNK_FRAMES


def test_vocoder_rejects_a_chunk_of_the_wrong_shape_naming_the_stage(stages):
    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        await queue.put({"latent": np.zeros((80, 4), dtype=np.float32)})
        ctx = DriverContext("r", queue, None, [])
        return await stages[2].process(StagePayload("r", request("x"), {}), ctx)

    with pytest.raises(StageError, match=r"'vocoder'.*\(192, frames\)"):
        asyncio.run(scenario())


def test_the_vocoder_decodes_windows_of_one_request_concurrently_and_streams_them_in_order(stages):
    """Two windows at once (threads), the audio identical to decoding one window after the other."""
    import threading
    import time as clock

    voice = stages[0].voice
    running = 0
    most = 0
    lock = threading.Lock()

    def tracked(latent):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            clock.sleep(0.02)  # long enough for a second window to start beside this one
            return voice.decode(latent)
        finally:
            with lock:
                running -= 1

    vocoder = demo.Vocoder(voice)
    vocoder.voice = type("Tracked", (), {"decode": staticmethod(tracked), "sample_rate": voice.sample_rate})()
    concurrent = run_chain([stages[0], stages[1], vocoder], request(LONG * 3, **PIPER_NOISELESS)).audio()
    quiet = SynthesisOptions(0.0, 0.0, 1.0)
    latent = np.concatenate([voice.acoustic(ids, quiet) for ids in voice.phoneme_ids(LONG * 3)], axis=1)
    one_by_one = ChunkedDecoder(voice.decode)
    sequential = np.clip(np.concatenate(one_by_one.push(latent) + one_by_one.finish()), -1.0, 1.0)
    assert most == min(demo.PARALLEL_DECODES, compute_pool().threads)
    assert concurrent.tobytes() == sequential.tobytes()


def test_the_vocoder_takes_every_chunk_while_its_decodes_are_still_running(stages):
    """The engine is never held up by the vocoder's decodes: its chunks are all taken before any decode ends."""
    import threading

    voice = stages[0].voice
    gate = threading.Event()

    def held(latent):
        gate.wait(30)  # bounded: the test releases it as soon as the producer is done
        return voice.decode(latent)

    vocoder = demo.Vocoder(voice)
    vocoder.voice = type("Held", (), {"decode": staticmethod(held), "sample_rate": voice.sample_rate})()
    quiet = SynthesisOptions(0.0, 0.0, 1.0)
    latent = np.concatenate([voice.acoustic(ids, quiet) for ids in voice.phoneme_ids(LONG * 2)], axis=1)
    pieces = [latent[:, i : i + demo.LATENT_CHUNK_FRAMES] for i in range(0, latent.shape[1], demo.LATENT_CHUNK_FRAMES)]
    assert len(pieces) > 2 * 8  # well over a stream window (8 chunks) of the engine's output

    async def scenario():
        from stagevisor.supervisor.dataplane.streams import ChunkQueue

        queue = ChunkQueue(8)  # what an in-process stream edge gives the vocoder

        class Context:
            request_id = "r"
            cancelled = False

            def __init__(self):
                self.audio = []

            async def stream(self, chunk):
                self.audio.append(chunk["audio"])

            def chunks(self):
                return queue.__aiter__()

        ctx = Context()
        stage = asyncio.ensure_future(vocoder.process(StagePayload("r", request("x"), {}), ctx))

        async def produce():
            for piece in pieces:
                await queue.put({"latent": piece})  # waits while 8 chunks are buffered
            queue.end()

        await asyncio.wait_for(produce(), 30)
        assert ctx.audio == []  # every chunk was taken, and not one decode has finished
        gate.set()
        await asyncio.wait_for(stage, 60)
        return np.concatenate(ctx.audio)

    try:
        audio = asyncio.run(scenario())
    finally:
        gate.set()
    decoder = ChunkedDecoder(voice.decode)
    expected = np.clip(np.concatenate(decoder.push(latent) + decoder.finish()), -1.0, 1.0)
    assert audio.tobytes() == expected.tobytes()


def test_a_first_sentences_flow_windows_end_where_the_vocoders_first_decode_windows_can_start():
    from stagevisor.stages.piper.executors import flow_windows
    from stagevisor.stages.piper.chunked import CONTEXT_FRAMES, WINDOW_SCHEDULE

    first, second = WINDOW_SCHEDULE[0] + CONTEXT_FRAMES, WINDOW_SCHEDULE[0] + WINDOW_SCHEDULE[1] + CONTEXT_FRAMES
    assert flow_windows(400, first=2) == [first, second, 400]
    assert flow_windows(400, first=1) == [first, 400]
    assert flow_windows(400, first=0) == [400]
    assert flow_windows(second, first=2) == [first, second]  # no empty window at the end
    assert flow_windows(second - 1, first=2) == [first, second - 1]
    assert flow_windows(10, first=2) == [10]
    assert flow_windows(0, first=2) == []


def test_an_engine_whose_pool_no_vocoder_shares_runs_the_short_flow_windows_one_after_the_other(stages):
    """With the vocoder in another process, the pool cannot keep its first window ahead: the flow takes turns."""
    from stagevisor.stages.compute import DeadlinePool

    engine = demo.TtsEngine(stages[1].voice)
    engine.pool = DeadlinePool(2, name="engine-only")  # as in a worker of its own: no Vocoder computes here
    calls: list[tuple[int, float, float]] = []
    real_flow = engine.voice.flow

    def timed_flow(prior, start, end):
        began = time.perf_counter()
        latent = real_flow(prior, start, end)
        calls.append((start, began, time.perf_counter()))
        return latent

    engine.voice = SimpleNamespace(prior=engine.voice.prior, flow=timed_flow, sample_rate=engine.voice.sample_rate)
    text = "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech."

    async def scenario():
        prepared = await stages[0].process(
            StagePayload("p", request(text, **PIPER_NOISELESS), {}), DriverContext("p", None, None, [])
        )
        await engine.process(
            StagePayload("r", request(text, **PIPER_NOISELESS), prepared), DriverContext("r", None, None, [])
        )

    asyncio.run(scenario())
    assert len(calls) == 3 and [start for start, _, _ in calls] == sorted(start for start, _, _ in calls)
    # each call began after the one before it ended
    assert all(later[1] >= earlier[2] for earlier, later in itertools.pairwise(calls))


def test_an_engine_alone_runs_a_first_sentences_prior_wide_and_cuts_its_flow_once_more_and_streams_the_same_latent(
    stages, monkeypatch
):
    from stagevisor.stages.piper.executors import FLOW_WINDOWS_ALONE, FLOW_WINDOWS_UNDER_LOAD, flow_windows

    engine = stages[1]
    if engine.pool.threads < 2:
        pytest.skip("the short flow windows run at once only with two compute threads")
    text = "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech."
    windows: list[tuple[int, int]] = []
    spare: list[bool] = []
    real_flow, real_prior = engine.voice.flow, engine.voice.prior
    # Alone, the first window waits here until the second has started: run one after the other, they never
    # would, and `together` records False after 30 s.
    second_started, together, gated = threading.Event(), [], [True]

    def recorded_flow(prior, start, end):
        windows.append((start, end))
        if gated[0] and start == 0:
            together.append(second_started.wait(30))
        elif gated[0]:
            second_started.set()
        return real_flow(prior, start, end)

    def recorded_prior(ids, options, spare_core=False):
        spare.append(spare_core)
        return real_prior(ids, options, spare_core)

    monkeypatch.setattr(engine.voice, "flow", recorded_flow)
    monkeypatch.setattr(engine.voice, "prior", recorded_prior)

    async def latent(request_id: str, prepared: dict) -> np.ndarray:
        sink: list = []
        await engine.process(
            StagePayload(request_id, request(text, **PIPER_NOISELESS), prepared),
            DriverContext(request_id, None, None, sink),
        )
        return np.concatenate([chunk["latent"] for chunk in sink], axis=1)

    async def scenario():
        prepared = await stages[0].process(
            StagePayload("p", request(text, **PIPER_NOISELESS), {}), DriverContext("p", None, None, [])
        )
        alone = await latent("alone", prepared)
        alone_windows, alone_spare = list(windows), list(spare)
        gated[0] = False
        # Another request held in the engine: its stream has room for one chunk and nobody reads it.
        held = asyncio.Queue(maxsize=1)
        holder = asyncio.ensure_future(
            engine.process(StagePayload("held", request(text), prepared), DriverContext("held", None, held, []))
        )
        for _ in range(3000):  # at most 30 s: the held request's prior and first flow window on a loaded machine
            if held.full():
                break
            await asyncio.sleep(0.01)
        assert held.full() and engine.requests == 1
        windows.clear()
        spare.clear()
        loaded = await latent("loaded", prepared)
        loaded_windows, loaded_spare = list(windows), list(spare)
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        return alone, alone_windows, alone_spare, loaded, loaded_windows, loaded_spare

    alone, alone_windows, alone_spare, loaded, loaded_windows, loaded_spare = asyncio.run(scenario())
    assert alone_spare == [True] and loaded_spare == [False]  # the prior on a spare core only when alone
    frames = alone.shape[1]
    ends = flow_windows(frames, first=FLOW_WINDOWS_ALONE)
    # The two short windows at once (in either order), the rest of the sentence after them.
    assert len(ends) == 3 and sorted(alone_windows) == list(zip([0, *ends[:-1]], ends, strict=True))
    assert together == [True] and alone_windows[-1] == (ends[1], ends[2])
    ends = flow_windows(frames, first=FLOW_WINDOWS_UNDER_LOAD)
    assert FLOW_WINDOWS_UNDER_LOAD < FLOW_WINDOWS_ALONE  # under load, fewer cuts: each costs flow frames
    assert len(ends) == 1 + FLOW_WINDOWS_UNDER_LOAD and loaded_windows == list(zip([0, *ends[:-1]], ends, strict=True))
    assert loaded.tobytes() == alone.tobytes()
    assert engine.requests == 0


def test_engine_and_vocoder_calls_are_needed_by_when_their_audio_plays(stages, monkeypatch):
    """Deadlines in the compute pool: first-audio work FIRST_AUDIO_SECONDS after arrival, later windows by playback."""
    import time as clock

    from stagevisor.stages.piper.chunked import HOP_SAMPLES

    pool = compute_pool()
    calls: list[tuple[float, str, object]] = []
    emitted: list[float] = []

    class Recording:
        threads = pool.threads

        async def run(self, deadline, fn, *args):
            name = getattr(fn, "__name__", "")
            calls.append((deadline, name, getattr(fn, "__self__", None)))
            return await pool.run(deadline, fn, *args)

    vocoder = demo.Vocoder(stages[0].voice)
    monkeypatch.setattr(stages[1], "pool", Recording())
    vocoder.pool = Recording()
    real_emit = vocoder._emit_one

    async def timed_emit(ctx, audio):
        emitted.append(clock.monotonic())
        await real_emit(ctx, audio)

    monkeypatch.setattr(vocoder, "_emit_one", timed_emit)
    text = LONG * 3
    before = clock.monotonic()
    result = run_chain([stages[0], stages[1], vocoder], request(text, **PIPER_NOISELESS))
    assert result.audio().size
    frame = HOP_SAMPLES / stages[0].voice.sample_rate
    engine = [deadline for deadline, name, _ in calls if name in ("prior", "flow")]
    windows = [(deadline, job.start) for deadline, name, job in calls if name == "run"]
    # The first sentence's prior and flow: FIRST_AUDIO_SECONDS after the request arrived.
    assert before + demo.FIRST_AUDIO_SECONDS <= engine[0] == engine[1] <= emitted[0] + demo.FIRST_AUDIO_SECONDS
    # A later sentence's: ENGINE_LEAD_SECONDS before its audio would play, counted from the same instant.
    assert len(stages[0].voice.phoneme_ids(text)) > 1 and engine[-1] > engine[0]
    # Windows: those cut before the first audio left are needed FIRST_AUDIO_SECONDS after the stream
    # opened, the rest when the audio before them has played, from the moment the first audio left.
    assert windows[0][1] == 0
    opened = windows[0][0] - demo.FIRST_AUDIO_SECONDS
    assert before <= opened <= emitted[0]
    bases = [deadline - start * frame for deadline, start in windows]
    playing = [base for base in bases if abs(base - windows[0][0]) > 1e-6]
    assert len(playing) >= len(windows) - demo.PARALLEL_DECODES - 1  # all but the windows cut before it left
    assert max(playing) - min(playing) < 1e-6 and opened <= playing[0] <= emitted[0]


def test_a_bad_compute_thread_count_fails_building_the_engine_and_the_vocoder_not_a_request(stages, monkeypatch):
    from stagevisor.stages import compute

    monkeypatch.setenv(compute.THREADS_ENV, "none")
    compute.compute_pool.cache_clear()
    try:
        for build in (demo.TtsEngine, demo.Vocoder):
            with pytest.raises(ValueError, match="STAGEVISOR_COMPUTE_THREADS must be a whole number >= 1, got 'none'"):
                build(stages[0].voice)
    finally:
        compute.compute_pool.cache_clear()  # the next user builds the pool from the environment as it is then
