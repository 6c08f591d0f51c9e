"""Qwen3-TTS's executors in one process on tiny random checkpoints, against qwen-tts's own generate() and decode.

The checkpoints are built at test time with the package's classes
(tests/qwen3_tiny.py). The stages run as the worker runs them (preprocessing,
then tts_engine streaming to the vocoder), through a context that records what
each streams. Needs the qwen3 extra; skipped without it (tests/markers.py).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np
import pytest

from stagevisor.stages.base import StagePayload

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = [pytest.mark.slow, pytest.mark.qwen3, pytest.mark.timeout(600)]

TEXT = "Hello, this is a tiny test checkpoint speaking."
TRANSCRIPT = "A reference transcript for voice cloning."
SEED = 1234
FRAMES = 30
"""max_new_tokens: the random talker seldom draws EOS, so every request ends at 29 frames (2.3 s of audio)."""
FLOAT_BOUND = 1e-5
"""Streamed PCM vs the package's whole decode, float32. The decoder is causal and 29 frames fit in the 72 frames of
left context, so each chunk is decoded after its whole history: only the summation order of its matmuls differs
(measured: 7.5e-8 on 40 frames)."""


class Recorder:
    """A StageContext: records what the stage streams; feeds `incoming` as its upstream's chunks."""

    def __init__(self, request_id: str, incoming: list[Any] | None = None) -> None:
        self.request_id = request_id
        self.cancelled = False
        self.streamed: list[Any] = []
        self.incoming = incoming or []

    async def stream(self, chunk: Any) -> None:
        self.streamed.append(chunk)

    async def chunks(self) -> AsyncIterator[Any]:
        for chunk in self.incoming:
            yield chunk


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.qwen3_tiny import build

    root = tmp_path_factory.mktemp("qwen3")
    return {kind: build(root / kind, kind) for kind in ("custom_voice", "base", "voice_design")}


@pytest.fixture(scope="module")
def stages(checkpoints):
    import torch

    from stagevisor.stages import qwen3

    torch.set_num_threads(1)
    built = {}
    for kind, path in checkpoints.items():
        engine = qwen3.tts_engine(str(path), dtype="float32")
        built[kind] = (qwen3.preprocessing(str(path)), engine, qwen3.vocoder(str(path), dtype="float32"))
    return built


def run_pipeline(stages: tuple, request: dict[str, Any], request_id: str = "r1") -> dict[str, Any]:
    preprocessing, engine, vocoder = stages

    async def go() -> dict[str, Any]:
        data = await preprocessing.process(StagePayload(request_id, request), Recorder(request_id))
        engine_ctx = Recorder(request_id)
        final = await engine.process(StagePayload(request_id, request, data), engine_ctx)
        vocoder_ctx = Recorder(request_id, engine_ctx.streamed)
        await vocoder.process(StagePayload(request_id, request), vocoder_ctx)
        return {"final": final, "chunks": engine_ctx.streamed, "audio": vocoder_ctx.streamed}

    return asyncio.run(go())


def options(**extra: str) -> dict[str, str]:
    return {"seed": str(SEED), "max_new_tokens": str(FRAMES), **extra}


def reference_audio() -> tuple[bytes, np.ndarray, int]:
    from stagevisor.stages.qwen3.executors import reference_wav
    from stagevisor.stages.reference import decode_reference_wav

    rng = np.random.default_rng(5)
    wav = reference_wav((0.2 * rng.standard_normal(16000 * 2)).astype(np.float32), 16000)
    samples, rate = decode_reference_wav(wav)
    return wav, samples, rate


def package_codes(wrapper: Any, **generate: Any) -> Any:
    """The package's own generate() for one text with the checkpoint's sampling defaults, seeded as the engine is."""
    import torch

    from stagevisor.stages.qwen3.prompt import assistant_text
    from stagevisor.stages.qwen3.request import Sampling

    ids = wrapper.processor(text=assistant_text(TEXT), return_tensors="pt")["input_ids"]
    kwargs = Sampling(max_new_tokens=FRAMES).generate_kwargs()
    sampling = {name: generate.pop(name) for name in list(generate) if name in kwargs}
    torch.manual_seed(SEED)
    codes, _ = wrapper.model.generate(input_ids=[ids], **generate, **{**kwargs, **sampling})
    return codes[0]


def loaded(stages: tuple) -> Any:
    return stages[1].loaded.wrapper


def test_the_streamed_codes_equal_the_packages_generate_for_a_preset_speaker(stages):
    result = run_pipeline(stages["custom_voice"], {"text": TEXT, "voice": "Vivian", "options": options()})
    streamed = np.concatenate([chunk["codes"] for chunk in result["chunks"]])
    expected = package_codes(
        loaded(stages["custom_voice"]), languages=["auto"], speakers=["vivian"], non_streaming_mode=True
    )
    assert streamed.shape == (FRAMES - 1, 16)
    assert np.array_equal(streamed, expected.numpy())
    assert result["final"] == {"frames": FRAMES - 1, "stopped": "max_new_tokens", "seed": SEED}


SAMPLINGS = {
    "defaults": {},
    "greedy codebooks 1-15": {"subtalker_dosample": False},
    "top_p and temperature": {"subtalker_top_p": 0.8, "subtalker_temperature": 1.3, "top_p": 0.9},
    "top_k 0": {"subtalker_top_k": 0, "top_k": 0},
}


@pytest.mark.parametrize("name", SAMPLINGS)
def test_the_direct_decode_step_draws_the_codes_of_the_packages_own(stages, name):
    """The step loop's own code-predictor loop (decode_step) against the package's decode step, which runs the code
    predictor through transformers' generate(): the same prompt and seed give the same frames, code for code."""
    import torch

    from stagevisor.stages.qwen3.request import Sampling
    from stagevisor.stages.qwen3.steps import Outcome, Talker, frames

    preprocessing, engine, _ = stages["custom_voice"]
    assert engine.loaded.talker.own_loop, "the tiny checkpoint's decode steps must take the direct loop"
    request = {"text": TEXT, "voice": "ryan", "options": options()}
    from stagevisor.stages.qwen3.request import parse

    prepared = preprocessing.prepare(engine.loaded, parse(request, preprocessing.checkpoint, Sampling()))
    sampling = Sampling(max_new_tokens=FRAMES, **SAMPLINGS[name])
    drawn = {}
    for own_loop in (True, False):
        torch.manual_seed(SEED)
        talker = Talker(engine.loaded.model, own_loop=own_loop)
        drawn[own_loop] = [f.clone() for f in frames(talker, prepared.prompt, sampling, lambda: False, Outcome())]
    assert len(drawn[True]) == FRAMES - 1
    assert all(torch.equal(a, b) for a, b in zip(drawn[True], drawn[False], strict=True))


def test_greedy_decoding_with_a_temperature_of_zero_gives_the_packages_codes(stages):
    # The package ignores the temperature where it does not sample; requests with 0 there were refused.
    sampling = {"do_sample": False, "temperature": 0.0, "subtalker_dosample": False, "subtalker_temperature": 0.0}
    greedy = {name: str(value).lower() for name, value in sampling.items()}
    result = run_pipeline(stages["custom_voice"], {"text": TEXT, "voice": "vivian", "options": options(**greedy)})
    streamed = np.concatenate([chunk["codes"] for chunk in result["chunks"]])
    expected = package_codes(
        loaded(stages["custom_voice"]), languages=["auto"], speakers=["vivian"], non_streaming_mode=True, **sampling
    )
    assert np.array_equal(streamed, expected.numpy())


def test_frames_are_streamed_in_chunks_as_they_are_made(stages):
    result = run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options()})
    # The first chunk leaves after the first frame, the next every 25 frames, the rest at the end.
    assert [len(chunk["codes"]) for chunk in result["chunks"]] == [1, 25, FRAMES - 1 - 26]
    assert [len(chunk["audio"]) for chunk in result["audio"]] == [1920, 25 * 1920, (FRAMES - 1 - 26) * 1920]


def test_a_request_cut_off_at_max_new_tokens_is_logged_with_its_id(stages, caplog):
    # The client's stream ends as after EOS; the operator learns from the log why the audio stops mid-sentence.
    with caplog.at_level("WARNING", logger="stagevisor.stages.qwen3.executors"):
        result = run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options()}, request_id="cut-1")
    assert result["final"]["stopped"] == "max_new_tokens"
    assert [record.getMessage() for record in caplog.records] == [
        f"request cut-1 reached max_new_tokens={FRAMES} before the talker ended its speech: its audio is cut off "
        f"after {FRAMES - 1} frames (2.3 s)"
    ]


def test_the_pcm_matches_the_packages_whole_decode(stages):
    result = run_pipeline(stages["custom_voice"], {"text": TEXT, "voice": "ryan", "options": options()})
    wrapper = loaded(stages["custom_voice"])
    codes = package_codes(wrapper, languages=["auto"], speakers=["ryan"], non_streaming_mode=True)
    (whole,), rate = wrapper.model.speech_tokenizer.decode([{"audio_codes": codes}])
    pcm = np.concatenate([chunk["audio"] for chunk in result["audio"]])
    assert rate == 24000 and {chunk["sample_rate"] for chunk in result["audio"]} == {24000}
    assert pcm.shape == whole.shape == ((FRAMES - 1) * 1920,)
    assert np.abs(whole).max() > 0.05, "the tiny decoder must make audible samples for the comparison to mean anything"
    assert np.abs(pcm - whole).max() <= FLOAT_BOUND


def test_cloning_on_a_base_checkpoint_streams_the_packages_codes_and_audio(stages):
    wav, samples, rate = reference_audio()
    request = {"text": TEXT, "reference_audio": wav, "reference_transcript": TRANSCRIPT, "options": options()}
    result = run_pipeline(stages["base"], request)
    wrapper = loaded(stages["base"])
    import torch

    items = wrapper.create_voice_clone_prompt(ref_audio=(samples, rate), ref_text=TRANSCRIPT)
    from stagevisor.stages.qwen3.prompt import reference_text

    ref_ids = wrapper.processor(text=reference_text(TRANSCRIPT), return_tensors="pt")["input_ids"]
    expected = package_codes(
        wrapper,
        ref_ids=[ref_ids],
        voice_clone_prompt=wrapper._prompt_items_to_voice_clone_prompt(items),
        languages=["auto"],
        non_streaming_mode=False,
    )
    streamed = np.concatenate([chunk["codes"] for chunk in result["chunks"]])
    assert np.array_equal(streamed, expected.numpy())
    # The reference's codes travel once, as the vocoder's left context; the package decodes them with the
    # generated codes and cuts their samples off, which the streamed audio equals.
    reference = items[0].ref_code
    assert np.array_equal(result["chunks"][0]["context"], reference.numpy())
    (whole,), _ = wrapper.model.speech_tokenizer.decode([{"audio_codes": torch.cat([reference, expected])}])
    pcm = np.concatenate([chunk["audio"] for chunk in result["audio"]])
    assert np.abs(pcm - whole[len(reference) * 1920 :]).max() <= FLOAT_BOUND


def test_cloning_from_the_reference_audio_alone_streams_the_packages_codes_for_its_speaker_vector(stages):
    """Without a transcript the voice is the reference's speaker vector alone (the package's x_vector_only_mode):
    the same codes as the package's generate() from that vector, and another voice's vector gives other codes.

    The other voice is a tone, not more noise: two noise references give speaker vectors within about 1e-3 of each
    other on the tiny random checkpoint, which draws the same codes from both (the package as well)."""
    from stagevisor.stages.qwen3.executors import reference_wav

    wav, samples, rate = reference_audio()
    result = run_pipeline(stages["base"], {"text": TEXT, "reference_audio": wav, "options": options()})
    assert "context" not in result["chunks"][0]
    streamed = streamed_codes(result["chunks"])
    assert streamed.shape == (FRAMES - 1, 16)
    wrapper = loaded(stages["base"])
    items = wrapper.create_voice_clone_prompt(ref_audio=(samples, rate), x_vector_only_mode=True)
    expected = package_codes(
        wrapper,
        voice_clone_prompt=wrapper._prompt_items_to_voice_clone_prompt(items),
        languages=["auto"],
        non_streaming_mode=False,
    )
    assert np.array_equal(streamed, expected.numpy())
    tone = reference_wav((0.5 * np.sin(2 * np.pi * 220 * np.arange(32000) / 16000)).astype(np.float32), 16000)
    other = run_pipeline(stages["base"], {"text": TEXT, "reference_audio": tone, "options": options()})
    assert not np.array_equal(streamed_codes(other["chunks"]), streamed)


def test_a_voice_cloned_again_is_not_encoded_again_and_clones_as_before(stages, monkeypatch):
    """1. a reference cloned from its speaker vector, then in context, then in context again: the speaker encoder
       runs once and the speech tokenizer's encoder once, and the last request's codes equal an uncached clone's;
    2. with two voices kept, a third evicts the least recently used, which is encoded again when it returns."""
    from stagevisor.stages.qwen3.executors import Preprocessing, reference_wav

    shared, engine, vocoder = stages["base"]
    calls = {"embed": 0, "encode": 0}
    model, tokenizer = engine.loaded.model, engine.loaded.speech_tokenizer
    for owner, name, counter in ((model, "extract_speaker_embedding", "embed"), (tokenizer, "encode", "encode")):
        original = getattr(owner, name)

        def counted(*args: Any, _original: Any = original, _counter: str = counter, **kwargs: Any) -> Any:
            calls[_counter] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    cached = (Preprocessing(shared.checkpoint, 2), engine, vocoder)
    uncached = (Preprocessing(shared.checkpoint, 0), engine, vocoder)
    wav, _, _ = reference_audio()
    alone = {"text": TEXT, "reference_audio": wav, "options": options()}
    in_context = {**alone, "reference_transcript": TRANSCRIPT}
    run_pipeline(cached, alone)
    assert calls == {"embed": 1, "encode": 0}
    run_pipeline(cached, in_context)
    got = streamed_codes(run_pipeline(cached, in_context)["chunks"])
    assert calls == {"embed": 1, "encode": 1}
    assert np.array_equal(got, streamed_codes(run_pipeline(uncached, in_context)["chunks"]))
    assert calls == {"embed": 2, "encode": 2}

    def voice(seed: int) -> bytes:
        return reference_wav((0.2 * np.random.default_rng(seed).standard_normal(16000)).astype(np.float32), 16000)

    for other in (voice(1), voice(2)):  # the first voice is now the least recently used: evicted
        run_pipeline(cached, {**alone, "reference_audio": other})
    assert calls["embed"] == 4
    run_pipeline(cached, alone)
    assert calls["embed"] == 5


def test_a_reference_too_short_to_clone_from_is_refused_before_any_model_work(stages):
    from stagevisor.stages.base import InvalidRequest
    from stagevisor.stages.qwen3.executors import PREPARED_REQUESTS, reference_wav

    # 10 ms: the speaker encoder's reflection padding fails on it, a RuntimeError the client saw as INTERNAL.
    wav = reference_wav((0.2 * np.random.default_rng(3).standard_normal(160)).astype(np.float32), 16000)
    for transcript in ({}, {"reference_transcript": TRANSCRIPT}):
        request = {"text": TEXT, "reference_audio": wav, "options": options(), **transcript}
        with pytest.raises(InvalidRequest, match=r"reference_audio is 0\.01 s long; at least 0\.5 s"):
            run_pipeline(stages["base"], request)
    assert len(PREPARED_REQUESTS) == 0


def test_a_negative_left_context_fails_the_vocoder_build_not_each_request(checkpoints):
    from stagevisor.stages import qwen3

    with pytest.raises(ValueError, match="left_context_frames must be >= 0, got -1"):
        qwen3.vocoder(str(checkpoints["custom_voice"]), dtype="float32", left_context_frames=-1)


def test_a_generation_config_the_sampling_cannot_take_fails_the_engine_build(checkpoints, tmp_path):
    import json
    import shutil

    from stagevisor.stages import qwen3
    from stagevisor.stages.qwen3.checkpoint import CheckpointError

    directory = shutil.copytree(checkpoints["custom_voice"], tmp_path / "greedy")
    config = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**config, "temperature": 0}))
    # It loaded and served READY, and every request failed in transformers' TemperatureLogitsWarper.
    with pytest.raises(CheckpointError, match="QWEN3_BAD_CHECKPOINT: .*greedy.*generation_config.json 'temperature'"):
        qwen3.tts_engine(str(directory), dtype="float32")


@pytest.mark.parametrize(
    ("damage", "stage"),
    [("truncate model.safetensors", "tts_engine"), ("remove speech_tokenizer/model.safetensors", "vocoder")],
)
def test_weights_that_cannot_be_loaded_are_a_bad_checkpoint_naming_its_directory(checkpoints, tmp_path, damage, stage):
    """A truncated model.safetensors failed the start with safetensors' own `invalid header length`, a missing
    speech tokenizer with transformers' `Error no file named`: the guide promises QWEN3_BAD_CHECKPOINT."""
    import shutil

    from stagevisor.stages import qwen3
    from stagevisor.stages.qwen3.checkpoint import CheckpointError

    directory = shutil.copytree(checkpoints["custom_voice"], tmp_path / "damaged")
    verb, name = damage.split(" ", 1)
    if verb == "truncate":
        (directory / name).write_bytes((directory / name).read_bytes()[:6])
    else:
        (directory / name).unlink()
    build = qwen3.tts_engine if stage == "tts_engine" else qwen3.vocoder
    with pytest.raises(
        CheckpointError, match=r"^QWEN3_BAD_CHECKPOINT: '.*damaged.*' cannot be loaded .* copy it again"
    ):
        build(str(directory), dtype="float32")


@pytest.mark.parametrize(
    ("damage", "raised"),
    [("drop text_vocab_size", "AttributeError"), ("halve hidden_size", "RuntimeError: .*size mismatch")],
)
def test_a_config_json_that_does_not_describe_its_weights_is_a_bad_checkpoint_naming_it(
    checkpoints, tmp_path, damage, raised
):
    """A talker_config lacking a key the package reads failed the start with its AttributeError
    ('Qwen3TTSTalkerConfig' object has no attribute 'text_vocab_size'), one whose size differs from the weights
    with torch's size-mismatch RuntimeError: the guide promises QWEN3_BAD_CHECKPOINT."""
    import json
    import shutil

    from stagevisor.stages import qwen3
    from stagevisor.stages.qwen3.checkpoint import CheckpointError

    directory = shutil.copytree(checkpoints["custom_voice"], tmp_path / "edited")
    config = json.loads((directory / "config.json").read_text())
    if damage == "drop text_vocab_size":
        del config["talker_config"]["text_vocab_size"]
    else:
        config["talker_config"]["hidden_size"] //= 2
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=rf"(?s)^QWEN3_BAD_CHECKPOINT: '.*edited/config.json' does not describe .*\({raised}"
    ):
        qwen3.tts_engine(str(directory), dtype="float32")


def test_a_checkpoint_whose_speaker_encoder_config_names_its_model_type_loads(checkpoints, tmp_path):
    """The loader's one workaround (stages/qwen3/loading.py): save_pretrained writes `model_type` into
    speaker_encoder_config, which the package's config class cannot read back."""
    import json
    import shutil

    from qwen_tts import Qwen3TTSModel

    from stagevisor.stages import qwen3

    directory = shutil.copytree(checkpoints["base"], tmp_path / "resaved")
    config = json.loads((directory / "config.json").read_text())
    config["speaker_encoder_config"]["model_type"] = "qwen3_tts_speaker_encoder"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(TypeError, match="model_type"):
        Qwen3TTSModel.from_pretrained(str(directory))
    engine = qwen3.tts_engine(str(directory), dtype="float32")
    assert engine.loaded.model.speaker_encoder is not None


def test_instructions_on_voice_design_change_the_codes(stages):
    plain = run_pipeline(stages["voice_design"], {"text": TEXT, "options": options()})
    designed = run_pipeline(stages["voice_design"], {"text": TEXT, "options": options(instructions="Whisper.")})
    first = np.concatenate([chunk["codes"] for chunk in plain["chunks"]])
    second = np.concatenate([chunk["codes"] for chunk in designed["chunks"]])
    assert not np.array_equal(first, second)


def test_the_same_seed_gives_the_same_audio_and_another_seed_other_audio(stages):
    def audio(seed: str) -> np.ndarray:
        request = {"text": TEXT, "options": {**options(), "seed": seed}}
        return np.concatenate([chunk["audio"] for chunk in run_pipeline(stages["custom_voice"], request)["audio"]])

    assert np.array_equal(audio("7"), audio("7"))
    assert not np.array_equal(audio("7"), audio("8"))


def test_an_unsupported_request_is_refused_with_its_code_before_any_model_work(stages):
    from stagevisor.stages.qwen3.request import Unsupported

    with pytest.raises(Unsupported) as caught:
        run_pipeline(stages["custom_voice"], {"text": TEXT, "reference_audio": b"RIFF"})
    assert caught.value.code == "QWEN3_NO_CLONING"
    from stagevisor.stages.qwen3.executors import PREPARED_REQUESTS

    assert len(PREPARED_REQUESTS) == 0


class Pipe:
    """A stream_to edge in one process: the engine's context streams into it, the vocoder's reads it."""

    def __init__(self, request_id: str, log: list[tuple[str, str]]) -> None:
        self.request_id = request_id
        self.cancelled = False
        self.log = log
        self.queue: asyncio.Queue = asyncio.Queue()

    async def stream(self, chunk: Any) -> None:
        if "audio" in chunk:
            self.log.append(("audio", self.request_id))
        else:
            await self.queue.put(chunk)

    async def chunks(self) -> AsyncIterator[Any]:
        while (chunk := await self.queue.get()) is not None:
            yield chunk


def test_requests_waiting_for_the_talker_do_not_starve_the_audio_of_the_one_it_serves(stages):
    """More requests than the worker has threads still stream: each one's first audio precedes its generation's end.

    1. the loop's default executor has 2 threads (a worker's has min(32, cores + 4));
    2. three requests enter preprocessing, tts_engine and the vocoder at once;
    3. requests waiting for the talker hold no thread, or the vocoder's decode of a served request's first chunk
       would queue behind them until another generation has ended.
    """
    from concurrent.futures import ThreadPoolExecutor

    preprocessing, _, vocoder = stages["custom_voice"]
    engine = engine_for(stages["custom_voice"], 1)  # one at a time: two of the three wait
    log: list[tuple[str, str]] = []

    async def one(request_id: str) -> None:
        request = {"text": TEXT, "options": options(seed=request_id[-1])}
        data = await preprocessing.process(StagePayload(request_id, request), Recorder(request_id))
        pipe = Pipe(request_id, log)

        async def generate() -> None:
            await engine.process(StagePayload(request_id, request, data), pipe)
            log.append(("generated", request_id))
            await pipe.queue.put(None)

        await asyncio.gather(generate(), vocoder.process(StagePayload(request_id, request), pipe))

    async def go() -> None:
        with ThreadPoolExecutor(2) as executor:
            asyncio.get_running_loop().set_default_executor(executor)
            await asyncio.gather(*(one(f"r{i}") for i in range(3)))

    asyncio.run(go())
    for request_id in ("r0", "r1", "r2"):
        assert log.index(("audio", request_id)) < log.index(("generated", request_id)), log


def streamed_codes(chunks: list[Any]) -> np.ndarray:
    return np.concatenate([chunk["codes"] for chunk in chunks])


class Timeline(Recorder):
    """A Recorder that also notes, in one list shared by several requests, when each streamed a chunk."""

    def __init__(self, request_id: str, events: list[tuple[str, str]]) -> None:
        super().__init__(request_id)
        self.events = events

    async def stream(self, chunk: Any) -> None:
        self.events.append(("chunk", self.request_id))
        await super().stream(chunk)


def engine_for(stages: tuple, max_streams: int) -> Any:
    """Another engine on the same loaded model: the shared one's turns are idle between tests."""
    from stagevisor.stages.qwen3.executors import TtsEngine

    shared = stages[1]
    return TtsEngine(shared.loaded, shared.first_chunk_frames, shared.chunk_frames, max_streams)


def together(stages: tuple, engine: Any, seeds: tuple[str, ...], events: list[tuple[str, str]]) -> list[np.ndarray]:
    """The requests' codes, all sent to `engine` at once; `events` gets each one's chunks and its generation's end."""
    preprocessing = stages[0]

    async def one(seed: str) -> np.ndarray:
        request, ctx = {"text": TEXT, "options": options(seed=seed)}, Timeline(f"together-{seed}", events)
        data = await preprocessing.process(StagePayload(ctx.request_id, request), Recorder(ctx.request_id))
        await engine.process(StagePayload(ctx.request_id, request, data), ctx)
        events.append(("generated", ctx.request_id))
        return streamed_codes(ctx.streamed)

    async def go() -> list[np.ndarray]:
        return await asyncio.gather(*(one(seed) for seed in seeds))

    return asyncio.run(go())


def test_concurrent_requests_take_turns_on_the_talker_and_each_gets_the_codes_its_seed_gives_alone(stages):
    """1. three requests at once on an engine stepping up to three in turn;
    2. each one's first chunk comes before any generation ends (they step in turn, not one after another);
    3. each streams the codes it streams alone (so what generate() gives it, test above): its generator state and
       the talker's rope offset are its own at each of its steps."""
    seeds = ("11", "12", "13")
    alone = {
        seed: streamed_codes(
            run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options(seed=seed)})["chunks"]
        )
        for seed in seeds
    }
    events: list[tuple[str, str]] = []
    codes = together(stages["custom_voice"], engine_for(stages["custom_voice"], 3), seeds, events)
    first_end = min(events.index(("generated", f"together-{seed}")) for seed in seeds)
    for seed, got in zip(seeds, codes, strict=True):
        assert events.index(("chunk", f"together-{seed}")) < first_end, events
        assert np.array_equal(got, alone[seed]), seed


def test_requests_beyond_max_streams_wait_for_a_turn(stages):
    """With max_streams=1 the second request's first chunk comes after the first's generation ends, and both get
    their seed's codes."""
    seeds = ("21", "22")
    alone = [
        streamed_codes(run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options(seed=seed)})["chunks"])
        for seed in seeds
    ]
    events: list[tuple[str, str]] = []
    codes = together(stages["custom_voice"], engine_for(stages["custom_voice"], 1), seeds, events)
    first, second = sorted((f"together-{seed}" for seed in seeds), key=lambda request: events.index(("chunk", request)))
    assert events.index(("generated", first)) < events.index(("chunk", second)), events
    assert all(np.array_equal(got, want) for got, want in zip(codes, alone, strict=True))


CANCEL_BOUND_S = 60.0
"""How long a cancelled request's generation may take to stop: one talker step is well under a second here, and the
3,999 frames it asked for take minutes."""


def test_a_request_cancelled_mid_generation_stops_and_frees_the_talker_for_the_next(stages):
    """1. a request asking for 4,000 frames is cancelled (its task, as the worker cancels it) after its first chunks;
    2. its generation stops within a step: the engine's turn and the talker's lock are free, nothing is left in
       the process-local registry;
    3. the next request gets the codes it got before (nothing of the cancelled one stays)."""
    from stagevisor.stages.qwen3.executors import PREPARED_REQUESTS

    preprocessing, engine, _ = stages["custom_voice"]
    before = streamed_codes(run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options()})["chunks"])
    long = {"text": TEXT, "options": options(max_new_tokens="4000")}

    async def cancel_mid_generation() -> bool:
        ctx = Recorder("cancelled-1")
        data = await preprocessing.process(StagePayload(ctx.request_id, long), Recorder(ctx.request_id))
        task = asyncio.ensure_future(engine.process(StagePayload(ctx.request_id, long, data), ctx))
        while len(ctx.streamed) < 2 and not task.done():  # bounded: the task ends by itself
            await asyncio.sleep(0.01)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=CANCEL_BOUND_S)
        return task in done and task.cancelled()

    assert asyncio.run(cancel_mid_generation()), f"the cancelled request's generation ran past {CANCEL_BOUND_S} s"
    assert engine.turns.streams == 0
    assert len(PREPARED_REQUESTS) == 0
    after = streamed_codes(run_pipeline(stages["custom_voice"], {"text": TEXT, "options": options()})["chunks"])
    assert np.array_equal(after, before)


def test_a_request_cancelled_while_waiting_for_a_turn_ends_at_once_and_the_served_one_goes_on(stages):
    """max_streams=1: a long request holds the talker; a second, waiting for its turn, is cancelled and ends
    without waiting for the first, which still streams, and then ends when cancelled in turn."""
    preprocessing = stages["custom_voice"][0]
    engine = engine_for(stages["custom_voice"], 1)
    long = {"text": TEXT, "options": options(max_new_tokens="4000")}

    async def go() -> tuple[bool, bool]:
        served, waiting = Recorder("served"), Recorder("waiting")
        tasks = []
        for ctx in (served, waiting):
            data = await preprocessing.process(StagePayload(ctx.request_id, long), Recorder(ctx.request_id))
            tasks.append(asyncio.ensure_future(engine.process(StagePayload(ctx.request_id, long, data), ctx)))
        while len(served.streamed) < 2 and not tasks[0].done():  # bounded: the task ends by itself
            await asyncio.sleep(0.01)
        tasks[1].cancel()
        done, _ = await asyncio.wait([tasks[1]], timeout=CANCEL_BOUND_S)
        waiting_ended_first = tasks[1] in done and not tasks[0].done() and not waiting.streamed
        tasks[0].cancel()
        done, _ = await asyncio.wait([tasks[0]], timeout=CANCEL_BOUND_S)
        return waiting_ended_first, tasks[0] in done

    waiting_ended_first, served_ended = asyncio.run(go())
    assert waiting_ended_first and served_ended
    assert engine.turns.streams == 0
