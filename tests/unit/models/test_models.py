"""The built-in model declarations match the model table (`stagevisor models`), and the registry resolves them."""

import importlib.metadata
import itertools
import json

import pydantic
import pytest

from stagevisor.models.declaration import ModelDeclaration, StageSpec, chain_pipeline
from stagevisor.models.qwen3 import QWEN3_SPEECH
from stagevisor.models.registry import builtin_models, resolve_model
from stagevisor.supervisor.placement.request import speech_config
from stagevisor.supervisor.errors import ConfigError, ErrorCode

# key -> [(stage, process, gpu, fraction)], as each model publishes them.
TOPOLOGY = {
    "higgs-tts": [
        ("preprocessing", "tts_frontend", None, None),
        ("audio_encoder", "tts_frontend", 0, 0.03),
        ("tts_engine", "pipeline", 0, 0.85),
        ("vocoder", "vocoder", 0, 0.10),
    ],
    "fishaudio-s2-pro": [
        ("preprocessing", "preprocessing", None, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "voxtral-tts": [
        ("preprocessing", "pipeline", None, None),
        ("tts_generation", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "ming-omni-tts": [
        ("preprocessing", "pipeline", None, None),
        ("reference_encode", "pipeline", 0, None),
        ("tts_engine", "pipeline", 0, None),
        ("audio_decode", "pipeline", 0, None),
    ],
    "moss-tts-local": [
        ("preprocessing", "pipeline", 0, None),
        ("tts_engine", "pipeline", 0, 0.90),
        ("vocoder", "pipeline", 0, None),
    ],
    "moss-tts-local-split": [
        ("preprocessing", "pipeline", 0, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "qwen3-tts": [
        ("preprocessing", "pipeline", None, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "moss-tts-delay": [
        ("preprocessing", "pipeline", None, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "audar-tts": [
        ("preprocessing", "pipeline", None, None),
        ("reference_encoder", "pipeline", 0, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "zonos2": [
        ("preprocessing", "pipeline", 0, None),
        ("speaker_encode", "pipeline", 0, None),
        ("tts_engine", "pipeline", 0, None),
        ("vocoder", "pipeline", 0, None),
    ],
    "demo": [
        ("preprocessing", "pipeline", None, None),
        ("tts_engine", "pipeline", None, None),
        ("vocoder", "pipeline", None, None),
    ],
    "piper": [
        ("preprocessing", "pipeline", None, None),
        ("tts_engine", "pipeline", None, None),
        ("vocoder", "pipeline", None, None),
    ],
}

SAFE_EDGES = {
    "higgs-tts": [("preprocessing", "audio_encoder"), ("audio_encoder", "tts_engine"), ("tts_engine", "vocoder")],
    "fishaudio-s2-pro": [("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
    "voxtral-tts": [("tts_generation", "vocoder")],
    "ming-omni-tts": [("tts_engine", "audio_decode")],
    "moss-tts-local": [("tts_engine", "vocoder")],
    "moss-tts-local-split": [],
    "qwen3-tts": [("tts_engine", "vocoder")],
    "moss-tts-delay": [("tts_engine", "vocoder")],
    "audar-tts": [
        ("preprocessing", "reference_encoder"),
        ("reference_encoder", "tts_engine"),
        ("tts_engine", "vocoder"),
    ],
    "zonos2": [("preprocessing", "speaker_encode"), ("speaker_encode", "tts_engine"), ("tts_engine", "vocoder")],
    "demo": [("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
    "piper": [("preprocessing", "tts_engine"), ("tts_engine", "vocoder")],
}

RECOMMENDED = {
    "higgs-tts": {},
    "fishaudio-s2-pro": {("tts_engine", "vocoder"): {"tts_engine": 0.85, "vocoder": 0.10}},
    "voxtral-tts": {("tts_generation", "vocoder"): {"tts_generation": 0.85, "vocoder": 0.10}},
    "ming-omni-tts": {
        ("tts_engine", "audio_decode"): {"reference_encode": 0.08, "tts_engine": 0.72, "audio_decode": 0.12}
    },
    "moss-tts-local": {("tts_engine", "vocoder"): {"preprocessing": 0.05, "tts_engine": 0.90, "vocoder": 0.05}},
    "moss-tts-local-split": {},
    "qwen3-tts": {("tts_engine", "vocoder"): {"tts_engine": 0.85, "vocoder": 0.10}},
    "moss-tts-delay": {("tts_engine", "vocoder"): {"tts_engine": 0.85, "vocoder": 0.10}},
    "audar-tts": {},
    "zonos2": {},
    "demo": {},
    "piper": {},
}

PATHS = {
    "bosonai/higgs-tts-3-4b": "higgs-tts",
    "fishaudio/s2-pro": "fishaudio-s2-pro",
    "mistralai/Voxtral-4B-TTS-2603": "voxtral-tts",
    "inclusionAI/Ming-omni-tts-16.8B-A3B": "ming-omni-tts",
    "OpenMOSS-Team/MOSS-TTS-Local-Transformer-v1.5": "moss-tts-local",
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base": "qwen3-tts",
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base": "qwen3-tts",
    "OpenMOSS-Team/MOSS-TTS-v1.5": "moss-tts-delay",
    "audarai/Audar-TTS-V1-Turbo": "audar-tts",
    "Zyphra/zonos2": "zonos2",
}

ARCHITECTURES = {
    "HiggsMultimodalQwen3ForConditionalGeneration": "higgs-tts",
    "FishQwen3OmniForCausalLM": "fishaudio-s2-pro",
    "VoxtralTTSForConditionalGeneration": "voxtral-tts",
    "BailingMMNativeForConditionalGeneration": "ming-omni-tts",
    "MossTTSLocalModel": "moss-tts-local",
    "Qwen3TTSForConditionalGeneration": "qwen3-tts",
    "MossTTSDelayModel": "moss-tts-delay",
    "AudarTTSForConditionalGeneration": "audar-tts",
    "Zonos2ForCausalLM": "zonos2",
}


def test_builtin_models_are_listed_in_design_order():
    assert [d.key for d in builtin_models()] == list(TOPOLOGY)


@pytest.mark.parametrize("key", list(TOPOLOGY))
def test_declared_stages_processes_gpus_and_fractions(key):
    stages = resolve_model(key).pipeline.stages
    assert [(s.name, s.process, s.gpu, s.fraction) for s in stages] == TOPOLOGY[key]


SENTENCE_STREAMS = {"demo"}
"""Models whose preprocessing streams its phonemes to the engine a sentence at a time."""


@pytest.mark.parametrize("key", list(TOPOLOGY))
def test_edges_are_next_links_in_stage_order_with_one_stream_edge_into_the_last_stage(key):
    stages = resolve_model(key).pipeline.stages
    for stage, following in itertools.pairwise(stages):
        assert stage.next == (following.name,)
    assert stages[-1].next == ()
    front = [(stages[1].name,)] if key in SENTENCE_STREAMS else [()]
    assert [s.stream_to for s in stages] == front + [()] * (len(stages) - 3) + [(stages[-1].name,), ()]


@pytest.mark.parametrize("key", list(SAFE_EDGES))
def test_process_safe_edges(key):
    assert list(resolve_model(key).pipeline.process_safe_edges) == SAFE_EDGES[key]


@pytest.mark.parametrize("key", list(RECOMMENDED))
def test_recommended_fractions_per_edge(key):
    resources = resolve_model(key).pipeline.process_edge_resources
    assert {r.edge: r.fractions for r in resources} == RECOMMENDED[key]


@pytest.mark.parametrize(
    "key, edge, words",
    [
        ("moss-tts-local", ("preprocessing", "tts_engine"), "PreparedRequestQueue"),
        ("moss-tts-delay", ("preprocessing", "tts_engine"), "PreparedRequestQueue"),
        ("qwen3-tts", ("preprocessing", "tts_engine"), "PREPARED_REQUESTS"),
        ("voxtral-tts", ("preprocessing", "tts_generation"), "in-process state"),
        ("ming-omni-tts", ("preprocessing", "reference_encode"), "in-process state"),
        ("ming-omni-tts", ("reference_encode", "tts_engine"), "in-process state"),
        ("moss-tts-local-split", ("tts_engine", "vocoder"), "cuda:1"),
        ("moss-tts-local-split", ("preprocessing", "tts_engine"), "cuda:1"),
    ],
)
def test_unsupported_edges_carry_the_reason_they_are_unsafe(key, edge, words):
    declaration = resolve_model(key)
    assert edge in declaration.unsupported_edges()
    assert words in declaration.reason_for(edge)


def test_ming_aliases_the_vocoder_role_to_audio_decode():
    assert resolve_model("ming-omni-tts").pipeline.role_aliases == {"vocoder": "audio_decode"}


@pytest.mark.parametrize("key", [k for k in TOPOLOGY if k not in ("demo", "piper", "qwen3-tts")])
def test_seed_models_use_standin_executors_named_for_model_and_stage(key):
    declaration = resolve_model(key)
    assert declaration.standin_executors
    for stage in declaration.pipeline.stages:
        assert stage.factory == "stagevisor.stages.standins:make"
        assert stage.args == {"model": key, "stage": stage.name}


def test_stand_ins_exist_for_every_stage_of_each_stand_in_model_and_for_no_other_model():
    from stagevisor.stages import standins

    declared = {d.key: [s.name for s in d.pipeline.stages] for d in builtin_models() if d.standin_executors}
    assert len(declared) == 9 and "qwen3-tts" not in declared
    assert {model: list(stages) for model, stages in standins.MODELS.items()} == declared


def test_qwen3_tts_runs_its_real_executors_one_factory_per_stage():
    declaration = resolve_model("qwen3-tts")
    assert not declaration.standin_executors
    assert [(stage.factory, stage.args) for stage in declaration.pipeline.stages] == [
        ("stagevisor.stages.qwen3:preprocessing", {}),
        ("stagevisor.stages.qwen3:tts_engine", {}),
        ("stagevisor.stages.qwen3:vocoder", {}),
    ]


@pytest.mark.parametrize("key, package", [("demo", "hibari"), ("piper", "piper")])
def test_the_voices_use_their_own_executors(key, package):
    declaration = resolve_model(key)
    assert not declaration.standin_executors
    assert [(s.factory, s.args) for s in declaration.pipeline.stages] == [
        (f"stagevisor.stages.{package}.executors:preprocessing", {}),
        (f"stagevisor.stages.{package}.executors:tts_engine", {}),
        (f"stagevisor.stages.{package}.executors:vocoder", {}),
    ]


def test_no_model_path_selects_the_demo():
    assert resolve_model(None).key == "demo"


@pytest.mark.parametrize("path, key", list(PATHS.items()))
def test_hf_style_paths_select_their_model(path, key):
    assert resolve_model(path).key == key


def test_hf_path_matching_ignores_case_and_a_trailing_slash():
    assert resolve_model("FishAudio/S2-Pro/").key == "fishaudio-s2-pro"


@pytest.mark.parametrize("architecture, key", list(ARCHITECTURES.items()))
def test_local_directory_selects_by_config_architectures(tmp_path, architecture, key):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    assert resolve_model(str(tmp_path)).key == key


def test_local_directory_with_unknown_architecture_is_unknown_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConfigError) as caught:
        resolve_model(str(tmp_path))
    assert caught.value.code is ErrorCode.UNKNOWN_MODEL
    assert "LlamaForCausalLM" in caught.value.message


def test_a_directory_without_config_json_is_refused_as_such(tmp_path):
    # It was "not a registry key, a known model path, or a directory with a config.json", as if no directory.
    with pytest.raises(ConfigError) as caught:
        resolve_model(str(tmp_path))
    assert caught.value.code is ErrorCode.UNKNOWN_MODEL
    assert f"unknown model directory {str(tmp_path)!r}: it holds no config.json" in caught.value.message
    assert "the one with config.json" in caught.value.message and "snapshots" not in caught.value.message


def test_a_hugging_face_cache_folder_is_pointed_at_its_snapshots(tmp_path):
    repo = tmp_path / "models--Qwen--Qwen3-TTS-12Hz-0.6B-Base"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    with pytest.raises(ConfigError) as caught:
        resolve_model(str(repo))
    assert f"Hugging Face cache folder, whose checkpoints are in {str(repo / 'snapshots')!r}" in caught.value.message


def test_unknown_model_lists_the_known_keys():
    with pytest.raises(ConfigError) as caught:
        resolve_model("nobody/nothing")
    assert caught.value.code is ErrorCode.UNKNOWN_MODEL
    assert all(d.key in caught.value.message for d in builtin_models())


def test_third_party_models_come_from_the_entry_point_group(monkeypatch):
    plugin = ModelDeclaration(
        key="acme-tts",
        display_name="Acme",
        pipeline=chain_pipeline(
            "acme-tts",
            [StageSpec("text", "pipeline", None), StageSpec("voice", "pipeline", None)],
            stream=("text", "voice"),
            factory="acme.stages:make",
        ),
        paths=("acme/tts",),
    )

    class Entry:
        name, value = "acme", "acme.models:DECLARATION"

        def load(self):
            return plugin

    def entry_points(group):
        return [Entry()] if group == "stagevisor.models" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert resolve_model("acme/tts") is plugin


def test_declarations_are_immutable():
    declaration = resolve_model("qwen3-tts")
    with pytest.raises(pydantic.ValidationError, match="frozen_instance"):
        declaration.pipeline.stages[0].process = "elsewhere"  # type: ignore[misc]


def test_a_home_directory_of_an_unknown_user_is_an_unknown_model_not_a_crash():
    with pytest.raises(ConfigError) as caught:
        resolve_model("~no-such-user-0/model")
    assert caught.value.code is ErrorCode.UNKNOWN_MODEL


def test_the_one_model_list_names_every_declaration_of_its_modules_once():
    import importlib

    from stagevisor.models.registry import BUILTIN_MODELS, builtin_models

    declared = {
        d.key for module in {m for _, m in BUILTIN_MODELS} for d in importlib.import_module(module).DECLARATIONS
    }
    listed = [key for key, _ in BUILTIN_MODELS]
    assert sorted(listed) == sorted(declared) and len(set(listed)) == len(listed)
    assert [d.key for d in builtin_models()] == listed


@pytest.mark.parametrize(
    "kind, size, clones, instructions",
    [("base", "1b7", True, False), ("custom_voice", "1b7", False, True), ("custom_voice", "0b6", False, False)],
)
def test_qwen3_requests_are_described_by_the_checkpoint_served_not_by_the_model(
    tmp_path, kind, size, clones, instructions
):
    """What `GET /v1/models` shows and the HTTP API checks: a CustomVoice checkpoint used to claim cloning and
    every language of the family."""
    from tests.qwen3_tiny import write_checkpoint

    speech = speech_config(str(write_checkpoint(tmp_path, kind, size)), None)
    assert (speech.clones, speech.instructions, speech.seed) == (clones, instructions, True)
    assert speech.languages == ("auto", "english", "chinese")


def test_the_default_voice_declares_the_seed_range_its_stages_check():
    from stagevisor.models.demo import HIBARI_SPEECH
    from stagevisor.stages.hibari.voice import SEED_MAX

    assert HIBARI_SPEECH.options is not None
    assert HIBARI_SPEECH.seed_maximum == HIBARI_SPEECH.options["seed"].maximum == SEED_MAX


def test_qwen3_sampling_options_are_declared_and_a_request_may_ask_for_the_checkpoints_own_frames(tmp_path):
    """GET /v1/models lists them and the HTTP API checks their types and bounds; the released checkpoints
    default to 8192 frames, which a request may then ask for too."""
    from tests.qwen3_tiny import write_checkpoint

    assert QWEN3_SPEECH.options is not None
    assert QWEN3_SPEECH.options["max_new_tokens"].maximum == 4096
    assert (QWEN3_SPEECH.options["top_k"].type, QWEN3_SPEECH.options["do_sample"].type) == ("integer", "boolean")
    directory = write_checkpoint(tmp_path, "custom_voice", "1b7")
    (directory / "generation_config.json").write_text('{"max_new_tokens": 8192, "top_k": 50}')
    options = speech_config(str(directory), None).options
    assert options is not None and options["max_new_tokens"].maximum == 8192
    (directory / "generation_config.json").write_text("{not json")  # the engine's start names it
    options = speech_config(str(directory), None).options
    assert options is not None and options["max_new_tokens"].maximum == 4096


def test_qwen3_without_a_checkpoint_found_is_described_as_declared(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert speech_config("Qwen/Qwen3-TTS-12Hz-1.7B-Base", None) == QWEN3_SPEECH


@pytest.mark.parametrize("kind", ["base", "custom_voice", "voice_design"])
def test_qwen3_declares_no_speaking_rate_as_its_stages_refuse_one(tmp_path, kind):
    """Its stages refuse `speed` and `length_scale` (QWEN3_NO_SPEED); GET /v1/models listed `speed` as taken, and
    the HTTP API sent it on, to be refused by the stage with no `param`."""
    from tests.qwen3_tiny import write_checkpoint

    assert QWEN3_SPEECH.speed is False
    assert speech_config(str(write_checkpoint(tmp_path, kind, "1b7")), None).speed is False
