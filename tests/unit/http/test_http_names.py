"""The names clients send: model aliases, OpenAI's voice names mapped onto whatever voices the model declares."""

from __future__ import annotations

from stagevisor.supervisor.http.names import (
    OPENAI_VOICES,
    SpeechSettings,
    default_voice_map,
    model_names,
    served_hub_id,
    unlisted_model_names,
    voice_map,
)
from stagevisor.supervisor.config.voices import unknown_voice_targets


def test_served_names_come_first_then_the_model_then_openai_names_unless_off():
    settings = SpeechSettings(served_model_names=("my-tts", "voice"), hub_ids=("org/demo",))
    assert model_names("demo", "org/demo", settings) == (
        "my-tts",
        "voice",
        "demo",
        "org/demo",
        "tts-1",
        "tts-1-hd",
        "gpt-4o-mini-tts",
        "gpt-4o-mini-tts-2025-12-15",
        "gpt-4o-mini-tts-2025-03-20",
    )
    assert model_names("demo", None, SpeechSettings(openai_aliases=False)) == ("demo",)


def test_a_model_path_that_is_a_local_directory_is_accepted_but_not_listed():
    """/v1/models listed `--model-path /srv/models/qwen3` as typed, showing every client the daemon's directory
    layout; a client already sending it keeps being answered."""
    settings = SpeechSettings(hub_ids=("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",))
    for path in ("/srv/models/qwen3", "checkpoints/qwen3", "~/models/qwen3"):
        assert path not in model_names("qwen3-tts", path, settings)
        assert unlisted_model_names("qwen3-tts", path, settings) == (path,)


def test_a_model_path_that_is_one_of_the_models_hub_ids_is_listed_as_declared_and_taken_in_any_case():
    """A hub id names a public checkpoint, nothing of this host; clients configured with it find it listed. It was
    listed as the operator typed it (`qwen/QWEN3-...`), and the id as published, which clients send, was a 404."""
    from stagevisor.supervisor.http.request import Served, answers_to

    declared = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    settings = SpeechSettings(hub_ids=(declared,))
    typed = "qwen/QWEN3-tts-12hz-0.6b-customvoice/"  # matched as the registry matches it: any case, a trailing slash
    assert model_names("qwen3-tts", typed, settings)[:2] == ("qwen3-tts", declared)
    assert unlisted_model_names("qwen3-tts", typed, settings) == (typed,)  # the operator's spelling still taken
    assert unlisted_model_names("qwen3-tts", "qwen3-tts", SpeechSettings()) == ()  # the key is listed
    served = Served(model_names("qwen3-tts", typed, settings), hub_id=served_hub_id(typed, settings))
    assert answers_to(declared, served) and answers_to(declared.lower(), served)
    assert not answers_to("Qwen/Qwen3-TTS-12Hz-1.7B-Base", served)  # another checkpoint of the model is not this


def test_one_declared_voice_takes_every_openai_name():
    assert default_voice_map([{"id": "heart"}]) == {name: "heart" for name in OPENAI_VOICES}


def test_several_voices_are_handed_out_in_turn_and_a_voice_named_like_openai_keeps_its_name():
    voices = [{"id": "a"}, {"id": "b", "aliases": ["echo"]}]
    mapping = default_voice_map(voices)
    assert mapping["echo"] == "b"
    others = [mapping[n] for n in OPENAI_VOICES if n != "echo"]
    assert others == ["a", "b"] * 6


def test_no_declared_voice_maps_every_name_to_the_default():
    assert set(default_voice_map([]).values()) == {""}


def test_the_config_map_overrides_and_the_models_own_names_are_not_aliases():
    voices = [{"id": "heart"}, {"id": "alloy"}]
    mapping = voice_map(voices, {"nova": "alloy", "narrator": "heart"})
    assert "alloy" not in mapping and mapping["nova"] == "alloy" and mapping["narrator"] == "heart"


def test_openais_newer_voices_marin_and_cedar_are_mapped_after_the_older_names():
    """Before: `marin` and `cedar`, built-in voices the openai SDKs list and OpenAI recommends, were 400
    voice_not_found; they come last, so the older names keep the voices they stood for."""
    mapping = default_voice_map([{"id": "a"}, {"id": "b"}, {"id": "c"}])
    assert (mapping["alloy"], mapping["verse"], mapping["marin"], mapping["cedar"]) == ("a", "b", "c", "a")


def test_config_voices_that_stand_for_no_voice_of_the_model_are_named_each_with_the_models_voices():
    voices = [{"id": "heart", "aliases": ["af_heart"]}, {"id": "bella"}]
    problems = unknown_voice_targets(voices, {"alloy": "heart", "old": "af_heart", "reader": "hearts", "x": "BELLA"})
    assert problems == [
        "the config's `voices` maps 'reader' onto 'hearts', which is not a voice of the model (its voices: 'heart', "
        "'bella'); requests for 'reader' get 400 voice_not_found until that entry names one of them",
    ]


def test_a_config_voice_target_in_another_case_is_the_models_voice_as_a_requests_voice_is():
    """`Heart2: HEART` logged a start-up warning and its requests got 400, where a request for `HEART` itself
    speaks with `heart`."""
    voices = [{"id": "heart", "aliases": ["af_heart"]}, {"id": "bella"}]
    mapping = voice_map(voices, {"Heart2": "HEART", "old": "AF_Heart", "reader": "hearts"})
    assert (mapping["Heart2"], mapping["old"], mapping["reader"]) == ("heart", "af_heart", "hearts")
    assert unknown_voice_targets([], {"reader": "hearts"}) == []  # a model that declares no voices: nothing to check


def test_a_change_of_the_voices_map_names_each_name_added_removed_and_moved_and_reads_back_from_its_json():
    from stagevisor.supervisor.config.voices import VoiceNamesChange

    change = VoiceNamesChange({"alloy": "heart", "nova": "heart"}, {"nova": "bella", "reader": "heart"}, ("x",))
    assert change.lines() == ["+ reader -> heart", "- alloy (stood for heart)", "~ nova -> bella (was heart)"]
    assert VoiceNamesChange.from_json(change.to_json()) == change
    assert not VoiceNamesChange({"a": "b"}, {"a": "b"}).changed
    assert VoiceNamesChange({"a": "b"}, {"a": "b"}).render() == "voices: no change"
