"""Stand-in executors: each model's stages, same speech as the demo, process-local handoffs that break when split."""

from __future__ import annotations

import asyncio
import io
import wave

import numpy as np
import pytest

from stagevisor.stages import standins
from stagevisor.stages.hibari import executors as demo
from stagevisor.stages.base import InvalidRequest, StageError, StagePayload
from stagevisor.stages.prepared import PreparedRequestQueue, ProcessLocalRegistry
from stagevisor.stages.reference import EMBEDDING_DIM, decode_reference_wav, speaker_embedding
from tests.unit.stage_driver import DriverContext, request, run_chain
from tests.fakes import FakeClock

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: the voice or hypothesis, minutes under load
pytestmark = pytest.mark.slow

TEXT = "Good morning. Stand-ins speak with the default voice."
LONGER = TEXT + " They keep each model's own stages, and the audio grows with the text."

SPEC_STAGES = {
    "higgs-tts": ["preprocessing", "audio_encoder", "tts_engine", "vocoder"],
    "fishaudio-s2-pro": ["preprocessing", "tts_engine", "vocoder"],
    "voxtral-tts": ["preprocessing", "tts_generation", "vocoder"],
    "ming-omni-tts": ["preprocessing", "reference_encode", "tts_engine", "audio_decode"],
    "moss-tts-local": ["preprocessing", "tts_engine", "vocoder"],
    "moss-tts-local-split": ["preprocessing", "tts_engine", "vocoder"],
    "moss-tts-delay": ["preprocessing", "tts_engine", "vocoder"],
    "audar-tts": ["preprocessing", "reference_encoder", "tts_engine", "vocoder"],
    "zonos2": ["preprocessing", "speaker_encode", "tts_engine", "vocoder"],
}

# (model, producing stage index, consuming stage index) of each unsafe edge.
UNSAFE_HANDOFFS = [
    ("moss-tts-local", 0, 1),
    ("moss-tts-local-split", 0, 1),
    ("moss-tts-delay", 0, 1),
    ("ming-omni-tts", 0, 1),
    ("ming-omni-tts", 1, 2),
    ("voxtral-tts", 0, 1),
]
REGISTRIES = [
    "PREPARED_REQUEST_QUEUE",
    "_MING_PROMPTS",
    "_VOXTRAL_VOICE_PROMPTS",
]


@pytest.fixture(scope="module")
def chains():
    return {m: [standins.make(model=m, stage=s) for s in names] for m, names in SPEC_STAGES.items()}


@pytest.fixture(scope="module")
def demo_audio():
    stages = [demo.preprocessing(), demo.tts_engine(), demo.vocoder()]
    return {t: run_chain(stages, request(t)).audio() for t in (TEXT, LONGER)}


def reference_wav(seconds: float = 1.0, rate: int = 16000, freq: float = 220.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


_split_ids = iter(range(10**9))


def run_split(stages, req, fresh_before: set[int], monkeypatch):
    """Run stages in order (the engine's stream goes nowhere), giving each stage in `fresh_before`
    brand-new registries, as a second process would have; returns the last stage's data."""
    rid = f"req-split-{next(_split_ids)}"
    touched = []

    async def go():
        data: dict = {}
        for i, stage in enumerate(stages):
            if i in fresh_before:
                for name in REGISTRIES:
                    old = getattr(standins, name)
                    touched.append(old)
                    monkeypatch.setattr(standins, name, type(old)(old.name, old.stages))
            data = await stage.process(StagePayload(rid, req, dict(data)), DriverContext(rid, None, None, [])) or {}
        return data

    try:
        return asyncio.run(go())
    finally:
        # The "first process" keeps the orphaned entry until it expires; do not let it leak into other tests.
        for registry in touched:
            registry.discard(rid)


def test_stand_in_stage_names_follow_each_models_declaration():
    assert {m: list(stages) for m, stages in standins.MODELS.items()} == SPEC_STAGES


@pytest.mark.parametrize("model", list(SPEC_STAGES))
def test_every_model_speaks_the_demo_audio_byte_for_byte_with_the_same_seed(chains, demo_audio, model):
    audio = run_chain(chains[model], request(TEXT)).audio()
    assert audio.tobytes() == demo_audio[TEXT].tobytes()


@pytest.mark.parametrize("model", list(SPEC_STAGES))
def test_every_model_makes_non_silent_audio_that_grows_with_the_text(chains, model):
    short = run_chain(chains[model], request(TEXT)).audio()
    longer = run_chain(chains[model], request(LONGER)).audio()
    assert float(np.sqrt(np.mean(np.square(short)))) > 0.01
    assert longer.shape[0] > 1.5 * short.shape[0]


@pytest.mark.parametrize("model", list(SPEC_STAGES))
def test_a_request_leaves_no_process_local_state_behind(chains, model):
    run_chain(chains[model], request(TEXT))
    assert all(len(getattr(standins, name)) == 0 for name in REGISTRIES)


@pytest.mark.parametrize("model, producer, consumer", UNSAFE_HANDOFFS)
def test_unsafe_edge_breaks_when_the_consumer_runs_in_another_process(chains, model, producer, consumer, monkeypatch):
    stages = chains[model][: consumer + 1]
    with pytest.raises(StageError, match="must share a process") as info:
        run_split(stages, request(TEXT), {consumer}, monkeypatch)
    stage_names = SPEC_STAGES[model]
    assert repr(stage_names[producer]) in str(info.value) and repr(stage_names[consumer]) in str(info.value)


@pytest.mark.parametrize("model", ["higgs-tts", "fishaudio-s2-pro", "audar-tts", "zonos2"])
def test_payload_carried_models_survive_every_split(chains, model, monkeypatch):
    req = {**request(TEXT), "reference_audio": reference_wav()}
    stages = chains[model]
    data = run_split(stages[:-1], req, set(range(len(stages) - 1)), monkeypatch)
    assert data["frames"] > 0 and data["conditioning"] == "reference"


@pytest.mark.parametrize(
    "model",
    [
        "higgs-tts",
        "fishaudio-s2-pro",
        "voxtral-tts",
        "ming-omni-tts",
        "moss-tts-local",
        "audar-tts",
        "zonos2",
    ],
)
def test_a_reference_is_encoded_and_reported_without_changing_the_audio(chains, demo_audio, model):
    req = {**request(TEXT), "reference_audio": reference_wav(), "reference_transcript": "a tone"}
    result = run_chain(chains[model], req)
    engine_final = result.finals[-2]
    assert engine_final["conditioning"] == "reference" and engine_final["reference_seconds"] == 1.0
    assert result.audio().tobytes() == demo_audio[TEXT].tobytes()


@pytest.mark.parametrize("model", ["higgs-tts", "ming-omni-tts", "voxtral-tts", "zonos2"])
def test_a_reference_that_is_not_a_wav_is_an_invalid_request(chains, model):
    with pytest.raises(InvalidRequest, match="reference_audio"):
        run_chain(chains[model], {**request(TEXT), "reference_audio": b"not a wav file at all"})


def test_a_wav_file_cut_off_inside_its_header_is_refused_saying_so():
    # wave raises a bare EOFError there: the client read "reference_audio must be a PCM WAV file: " and no more.
    with pytest.raises(InvalidRequest, match=r"must be a PCM WAV file: it ends inside its header$"):
        decode_reference_wav(reference_wav(freq=150.0)[:30])


def test_a_float_wav_is_refused_naming_its_sample_format_and_how_to_convert_it():
    """Before: "reference_audio must be a PCM WAV file: unknown format: 3", Python's wave module's words."""
    import struct

    whole = reference_wav(seconds=0.5)
    as_float = whole[:20] + struct.pack("<H", 3) + whole[22:]  # the fmt chunk's format tag: 3, IEEE float
    with pytest.raises(InvalidRequest, match=r"this one holds float samples \(WAVE format 3\): convert it to 16-bit"):
        decode_reference_wav(as_float)


def test_a_wav_streamed_without_its_length_is_read_to_its_end():
    """A header saying "length unknown" (0xFFFFFFFF, as a streamed WAV's) read as 44739.2 s and was refused."""
    import struct

    whole = reference_wav(seconds=2.0)
    unknown = struct.pack("<I", 0xFFFFFFFF - 36)  # http.audio.wav_header's: the RIFF size 36 more
    streamed = whole[:4] + struct.pack("<I", 0xFFFFFFFF) + whole[8:40] + unknown + whole[44:]
    samples, rate = decode_reference_wav(streamed)
    assert (samples.size, rate) == (32000, 16000)
    np.testing.assert_array_equal(samples, decode_reference_wav(whole)[0])
    with pytest.raises(InvalidRequest, match=r"runs past the limit; at most 60 s are accepted$"):
        decode_reference_wav(streamed + bytes(2 * 16000 * 59))


@pytest.mark.parametrize("rate", [1, 100, 7999, 192001, 0xFFFFFFFF])
def test_a_reference_at_a_sample_rate_http_refuses_is_refused_over_grpc_too(rate):
    """Over gRPC a WAV header of 1 Hz was cloned from (60 samples of "voice"), and one of 4294967295 Hz reached a
    stage that spoke at it, failing the request in the daemon; HTTP took 8000 to 192000 Hz only."""
    import struct

    whole = reference_wav(seconds=0.5)
    header_rate = whole[:24] + struct.pack("<II", rate, (2 * rate) & 0xFFFFFFFF) + whole[32:]
    with pytest.raises(InvalidRequest, match=rf"^reference_audio has a sample rate of {rate} Hz; 8000 to 192000 are"):
        decode_reference_wav(header_rate)


@pytest.mark.parametrize("rate", [8000, 192000])
def test_a_reference_at_the_edges_of_the_sample_rates_is_read(rate):
    samples, read_rate = decode_reference_wav(reference_wav(seconds=0.5, rate=rate))
    assert (samples.size, read_rate) == (rate // 2, rate)


@pytest.mark.parametrize("model", ["ming-omni-tts", "voxtral-tts", "moss-tts-local"])
def test_a_request_failing_on_its_reference_leaves_no_process_local_state(chains, model):
    with pytest.raises(InvalidRequest):
        run_chain(chains[model], {**request(TEXT), "reference_audio": b"RIFF-but-broken"})
    assert all(len(getattr(standins, name)) == 0 for name in REGISTRIES)


def test_speaker_embedding_is_deterministic_unit_norm_and_tells_voices_apart():
    low, rate = decode_reference_wav(reference_wav(freq=150.0))
    high, _ = decode_reference_wav(reference_wav(freq=2000.0))
    a, b = speaker_embedding(low, rate), speaker_embedding(low, rate)
    c = speaker_embedding(high, rate)
    assert a.shape == (EMBEDDING_DIM,) and a.tobytes() == b.tobytes()
    assert abs(float(np.linalg.norm(a)) - 1.0) < 1e-5
    assert float(np.dot(a, c)) < 0.9


def test_make_rejects_an_unknown_model_naming_the_known_ones():
    with pytest.raises(ValueError, match="higgs-tts"):
        standins.make(model="nope", stage="vocoder")


def test_make_rejects_an_unknown_stage_naming_the_models_stages():
    with pytest.raises(ValueError, match="audio_decode"):
        standins.make(model="ming-omni-tts", stage="vocoder")


def test_make_accepts_the_injected_placement_arguments():
    stage = standins.make(
        model="zonos2", stage="vocoder", model_path="Zyphra/zonos2", gpu_id=0, total_gpu_memory_fraction=0.1
    )
    assert isinstance(stage, demo.Vocoder)


def test_ming_audio_decode_names_itself_in_errors(chains):
    ctx = DriverContext("r", None, None, [])
    with pytest.raises(StageError, match="'audio_decode'"):
        asyncio.run(chains["ming-omni-tts"][-1].process(StagePayload("r", request(TEXT), {}), ctx))


def test_registry_pop_removes_the_entry():
    registry = ProcessLocalRegistry("test registry", ("a", "b"))
    registry.put("r1", 1)
    assert registry.pop("r1", "b") == 1
    assert len(registry) == 0
    with pytest.raises(StageError, match="'a' and 'b' must share a process"):
        registry.pop("r1", "b")


def test_registry_expires_entries_abandoned_between_the_stages():
    clock = FakeClock()
    registry = PreparedRequestQueue("test queue", ("a", "b"), ttl_s=60, clock=clock)
    registry.put("abandoned", 1)
    clock.now += 30
    registry.put("fresh", 2)
    clock.now += 31
    assert "abandoned" not in registry and "fresh" in registry
    clock.now += 30
    assert len(registry) == 0


def test_a_full_registry_refuses_new_requests_instead_of_evicting_live_ones():
    registry = ProcessLocalRegistry("test registry", ("a", "b"), capacity=2)
    registry.put("r1", 1)
    registry.put("r2", 2)
    with pytest.raises(StageError, match="retry later"):
        registry.put("r3", 3)
    assert registry.pop("r1", "b") == 1 and registry.pop("r2", "b") == 2


def test_registry_refuses_a_duplicate_request_id():
    registry = ProcessLocalRegistry("test registry", ("a", "b"))
    registry.put("r1", 1)
    with pytest.raises(StageError, match="already waiting"):
        registry.put("r1", 2)


def test_every_refusal_of_a_reference_carries_a_code_a_grpc_client_can_act_on():
    """Over gRPC these refusals carried no `stagevisor-error-code`, where HTTP answers `invalid_audio` or
    `audio_too_long` for the same files: a client could tell them apart only by their words."""
    import struct

    from stagevisor.stages.reference import REFERENCE_TOO_LONG, REFERENCE_UNREADABLE

    whole = reference_wav(seconds=0.5)
    unreadable = {
        "no WAV file": b"not a wav file at all",
        "cut inside its header": whole[:30],
        "float samples": whole[:20] + struct.pack("<H", 3) + whole[22:],
        "1 Hz": whole[:24] + struct.pack("<II", 1, 2) + whole[32:],
        "no samples": whole[:40] + struct.pack("<I", 0),
    }
    for why, data in unreadable.items():
        with pytest.raises(InvalidRequest) as refused:
            decode_reference_wav(data)
        assert refused.value.code == REFERENCE_UNREADABLE, why
    with pytest.raises(InvalidRequest) as refused:
        decode_reference_wav(reference_wav(seconds=61.0))
    assert refused.value.code == REFERENCE_TOO_LONG
