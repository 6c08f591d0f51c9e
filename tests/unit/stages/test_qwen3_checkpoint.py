"""Locating a Qwen3-TTS checkpoint (local directory or hub id in the local cache) and reading what it supports."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagevisor.stages.qwen3 import checkpoint as checkpoint_module
from stagevisor.stages.qwen3.checkpoint import CheckpointError, describe, hub_cache_root, locate
from tests.qwen3_tiny import write_checkpoint


def test_a_local_directory_is_read_for_its_type_speakers_and_languages(tmp_path):
    found = locate(str(write_checkpoint(tmp_path)))
    assert found.directory == tmp_path
    assert (found.kind, found.size) == ("custom_voice", "1b7")
    assert found.speakers == ("ryan", "vivian")
    assert found.languages == ("auto", "english", "chinese")  # dialects are speakers' variants, not languages


@pytest.mark.parametrize(
    "kind, size, clones, speakers, instructions",
    [
        ("base", "1b7", True, False, False),
        ("custom_voice", "1b7", False, True, True),
        ("custom_voice", "0b6", False, True, False),
        ("voice_design", "1b7", False, False, True),
    ],
)
def test_what_each_checkpoint_type_supports(tmp_path, kind, size, clones, speakers, instructions):
    found = describe(write_checkpoint(tmp_path, kind, size))
    assert (found.clones, found.has_speakers, found.follows_instructions) == (clones, speakers, instructions)


@pytest.mark.parametrize(
    "saved, expected",
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),  # the released checkpoints (transformers before 4.56)
        ({"dtype": "bfloat16"}, "bfloat16"),  # saved with transformers 4.57, the version qwen-tts pins
        ({"dtype": "float16", "torch_dtype": "bfloat16"}, "float16"),  # transformers reads `dtype` first
        ({}, None),
    ],
)
def test_the_saved_dtype_is_read_from_either_key(tmp_path, saved, expected):
    # `dtype: auto` loads it on a GPU; with only `dtype` in config.json it loaded float32, twice the memory.
    assert describe(write_checkpoint(tmp_path, **saved)).dtype == expected


def test_a_hub_id_is_found_in_the_local_cache_by_its_main_ref(tmp_path):
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-0.6B-Base"
    write_checkpoint(repo / "snapshots" / "abc123", kind="base", size="0b6")
    write_checkpoint(repo / "snapshots" / "old999", kind="base", size="0b6")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123\n")
    found = locate("Qwen/Qwen3-TTS-12Hz-0.6B-Base", environ={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert found.directory == repo / "snapshots" / "abc123"
    assert found.kind == "base"


def test_a_hub_id_typed_in_another_case_finds_the_cached_checkpoint(tmp_path):
    # `--model-path qwen/qwen3-tts-12hz-0.6b-base` chose Qwen3-TTS (ids match in any case), then found no
    # checkpoint: the cache folder is models--Qwen--..., named as the id was spelled when it was downloaded.
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-0.6B-Base"
    write_checkpoint(repo / "snapshots" / "abc123", kind="base", size="0b6")
    found = locate("qwen/qwen3-tts-12hz-0.6b-base", environ={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert found.directory == repo / "snapshots" / "abc123"


@pytest.mark.parametrize(
    "kind, size, says",
    [
        ("custom_voice", "1b7", "CustomVoice 1b7 checkpoint {dir}: preset speakers ryan, vivian; follows instructions"),
        ("custom_voice", "0b6", "CustomVoice 0b6 checkpoint {dir}: preset speakers ryan, vivian; no instructions"),
        ("base", "0b6", "Base 0b6 checkpoint {dir}: voices cloned from reference audio; no instructions"),
        ("voice_design", "1b7", "VoiceDesign 1b7 checkpoint {dir}: voices described in instructions; follows"),
    ],
)
def test_the_summary_tells_the_operator_what_the_checkpoint_serves(tmp_path, kind, size, says):
    directory = write_checkpoint(tmp_path / kind, kind=kind, size=size)
    summary = locate(str(directory)).summary()
    assert summary.startswith("Qwen3-TTS " + says.format(dir=repr(str(directory)))), summary
    assert summary.endswith("; languages auto, english, chinese"), summary


def test_the_hub_cache_is_the_one_huggingface_hub_picks():
    """With HF_HUB_CACHE set, HF_HOME/hub was searched too: a checkpoint the library would not find was served."""
    assert hub_cache_root({"HF_HOME": "/srv/hf"}) == Path("/srv/hf/hub")
    assert hub_cache_root({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub_cache_root({"HUGGINGFACE_HUB_CACHE": "/old", "HF_HOME": "/h"}) == Path("/old")
    assert hub_cache_root({}) == Path("~/.cache/huggingface/hub").expanduser()


def test_a_missing_checkpoint_names_every_path_searched(tmp_path):
    with pytest.raises(CheckpointError) as caught:
        locate("Qwen/Qwen3-TTS-12Hz-1.7B-Base", environ={"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert caught.value.code == "QWEN3_NO_CHECKPOINT"
    message = str(caught.value)
    assert str(tmp_path / "cache" / "models--Qwen--Qwen3-TTS-12Hz-1.7B-Base") in message
    assert "nothing is downloaded" in message


def test_no_model_path_at_all_says_a_checkpoint_is_needed():
    with pytest.raises(CheckpointError, match="needs a checkpoint") as caught:
        locate(None, environ={})
    assert caught.value.code == "QWEN3_NO_CHECKPOINT"


def test_another_architecture_is_refused_by_name(tmp_path):
    write_checkpoint(tmp_path, architectures=["SomethingElse"])
    with pytest.raises(CheckpointError, match="SomethingElse") as caught:
        locate(str(tmp_path))
    assert caught.value.code == "QWEN3_BAD_CHECKPOINT"


def test_a_25hz_checkpoint_is_refused_as_unsupported(tmp_path):
    write_checkpoint(tmp_path, tokenizer_type="qwen3_tts_tokenizer_25hz")
    with pytest.raises(CheckpointError, match="12 Hz") as caught:
        locate(str(tmp_path))
    assert caught.value.code == "QWEN3_UNSUPPORTED_CHECKPOINT"


def test_a_checkpoint_without_its_speech_tokenizer_is_incomplete(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "speech_tokenizer" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="speech_tokenizer/config.json"):
        locate(str(tmp_path))


def test_requirements_name_the_paths_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (unmet,) = checkpoint_module.requirements("Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    assert unmet.startswith("QWEN3_NO_CHECKPOINT") and str(tmp_path / "cache") in unmet


def test_the_model_key_alone_names_no_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    (unmet,) = checkpoint_module.requirements("qwen3-tts")
    assert "qwen3-tts needs a checkpoint and none was named" in unmet


def test_requirements_are_met_by_a_checkpoint(tmp_path):
    assert checkpoint_module.requirements(str(write_checkpoint(tmp_path))) == []


def test_serve_names_the_qwen3_extra_when_its_packages_are_missing():
    from stagevisor.models.registry import resolve_model
    from stagevisor.stages.extras import missing_extras

    stages = resolve_model("qwen3-tts").pipeline.stages
    (missing,) = missing_extras(((s.name, s.factory) for s in stages), installed=lambda module: module == "torch")
    assert missing.extra.name == "qwen3" and missing.stages == ("preprocessing", "tts_engine", "vocoder")
    assert missing.missing == ("qwen_tts", "transformers", "torchaudio")
    assert "install the 'qwen3' extra" in missing.message()


@pytest.mark.parametrize(
    "overrides, code, named",
    [
        ({"architectures": 5}, "QWEN3_BAD_CHECKPOINT", "architectures"),
        ({"architectures": "Qwen3TTSForConditionalGeneration"}, "QWEN3_BAD_CHECKPOINT", "architectures"),
        ({"tts_model_type": ["base"]}, "QWEN3_UNSUPPORTED_CHECKPOINT", "tts_model_type"),
        ({"talker_config": "x"}, "QWEN3_BAD_CHECKPOINT", "talker_config"),
        ({"talker_config": {"spk_id": ["ryan"]}}, "QWEN3_BAD_CHECKPOINT", "talker_config.spk_id"),
        ({"talker_config": {"codec_language_id": ["english"]}}, "QWEN3_BAD_CHECKPOINT", "codec_language_id"),
    ],
)
def test_a_config_with_ill_typed_fields_is_a_coded_error_not_a_traceback(tmp_path, overrides, code, named):
    with pytest.raises(CheckpointError) as caught:
        describe(write_checkpoint(tmp_path, **overrides))
    assert caught.value.code == code and named in str(caught.value)
    assert checkpoint_module.requirements(str(tmp_path)) == [str(caught.value)]


@pytest.mark.parametrize(
    "dialects, speaker",
    [(None, "ryan"), ({"ryan": False}, "vivian"), ({"ryan": False, "vivian": "klingon_dialect"}, "vivian")],
)
def test_a_speaker_without_a_usable_dialect_entry_is_a_bad_checkpoint(tmp_path, dialects, speaker):
    # The prompt reads spk_is_dialect[speaker] for every chinese or auto request: it failed each one with INTERNAL.
    talker = {"spk_id": {"ryan": 3000, "vivian": 3001}, "codec_language_id": {"english": 2050}}
    if dialects is not None:
        talker["spk_is_dialect"] = dialects
    with pytest.raises(CheckpointError, match=rf"QWEN3_BAD_CHECKPOINT: .*spk_is_dialect\['{speaker}'\]"):
        describe(write_checkpoint(tmp_path, talker_config=talker))


@pytest.mark.parametrize("removed", ["vocab.json", "merges.txt"])
def test_a_checkpoint_without_its_text_tokenizer_is_refused_before_loading(tmp_path, removed):
    # Loading it failed the stage's build with "TypeError: expected str, bytes or os.PathLike object, not NoneType".
    (write_checkpoint(tmp_path) / removed).unlink()
    with pytest.raises(CheckpointError, match="QWEN3_BAD_CHECKPOINT: .* lacks its text tokenizer"):
        describe(tmp_path)


def test_a_text_tokenizer_in_tokenizer_json_alone_is_enough(tmp_path):
    (write_checkpoint(tmp_path) / "vocab.json").unlink()
    (tmp_path / "tokenizer.json").write_text("{}")
    assert describe(tmp_path).kind == "custom_voice"


def test_a_config_without_a_tokenizer_type_says_so_not_that_it_uses_tokenizer_none(tmp_path):
    """serve said "uses speech tokenizer None; only the 12 Hz checkpoints are served" for a config.json lacking the
    key, as if the checkpoint named a tokenizer called None."""
    import json

    write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["tokenizer_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        describe(tmp_path)
    assert caught.value.code == "QWEN3_BAD_CHECKPOINT"
    assert "names no tokenizer_type" in str(caught.value) and "None" not in str(caught.value)


@pytest.mark.parametrize("talker", ["absent", None])
def test_a_config_without_a_talker_config_is_a_bad_checkpoint_before_anything_loads(tmp_path, talker):
    """Before: described as a checkpoint with no speakers and only `auto`, so `plan` and `check` passed it and only
    the start refused it, once the package had built a talker of its default sizes and its weights did not fit."""
    import json

    write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if talker == "absent":
        del config["talker_config"]
    else:
        config["talker_config"] = talker
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        describe(tmp_path)
    assert caught.value.code == "QWEN3_BAD_CHECKPOINT"
    assert str(caught.value) == (
        f"QWEN3_BAD_CHECKPOINT: {str(tmp_path / 'config.json')!r} does not describe a model its weights load into "
        "(it has no talker_config); restore the checkpoint's own config.json"
    )
    assert checkpoint_module.requirements(str(tmp_path)) == [str(caught.value)]
