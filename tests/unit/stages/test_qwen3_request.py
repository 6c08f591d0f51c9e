"""A request read against a Qwen3-TTS checkpoint: what each type serves, and the coded refusals of what it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from stagevisor.stages.base import InvalidRequest
from stagevisor.stages.qwen3.checkpoint import Checkpoint
from stagevisor.stages.qwen3.request import Sampling, Unsupported, parse, sampling_defaults

LANGUAGES = ("auto", "english", "chinese")


def checkpoint(kind: str, size: str = "1b7") -> Checkpoint:
    speakers = ("ryan", "vivian") if kind == "custom_voice" else ()
    return Checkpoint(Path("/ckpt"), kind, size, speakers, LANGUAGES)


def read(kind: str, size: str = "1b7", defaults: Sampling | None = None, **request: object):
    return parse({"text": "Hello.", **request}, checkpoint(kind, size), defaults or Sampling())


def refusal(kind: str, size: str = "1b7", **request: object) -> Unsupported:
    with pytest.raises(Unsupported) as caught:
        read(kind, size, **request)
    return caught.value


def test_custom_voice_takes_a_preset_speaker_case_insensitively():
    assert read("custom_voice", voice="Vivian").speaker == "vivian"


@pytest.mark.parametrize("voice", ["Alice", "alice", "ALICE "])
def test_a_speaker_named_in_capitals_is_found_by_any_case_and_read_as_the_config_spells_it(voice):
    # A fine-tune's speaker is named as its trainer gave it (sft_12hz.py --speaker_name Alice) and listed so by
    # GET /v1/audio/voices; the prompt looks it up in spk_id by that spelling. It was refused as unknown, naming itself.
    fine_tune = Checkpoint(Path("/ckpt"), "custom_voice", "1b7", ("Alice",), LANGUAGES)
    assert parse({"text": "Hello.", "voice": voice}, fine_tune, Sampling()).speaker == "Alice"


def test_custom_voice_without_a_voice_speaks_with_its_first_speaker():
    assert read("custom_voice").speaker == "ryan"
    assert read("custom_voice", voice="default").speaker == "ryan"


def test_an_unknown_speaker_is_refused_with_the_list():
    error = refusal("custom_voice", voice="alloy")
    assert error.code == "QWEN3_UNKNOWN_SPEAKER"
    assert "ryan, vivian" in str(error)


def test_cloning_on_a_custom_voice_checkpoint_is_refused():
    assert refusal("custom_voice", reference_audio=b"RIFF").code == "QWEN3_NO_CLONING"


def test_a_base_checkpoint_needs_a_reference():
    assert refusal("base").code == "QWEN3_NEEDS_REFERENCE"


def test_the_refusals_that_ask_for_a_reference_name_its_http_fields_too():
    # An HTTP client was told to give reference_audio and reference_transcript, fields its API names ref_audio and
    # ref_text.
    needs = str(refusal("base"))
    assert (
        "reference_audio (HTTP: ref_audio; CLI: --reference-audio)" in needs
        and "reference_transcript (HTTP: ref_text; CLI: --reference-transcript)" in needs
    )
    assert "reference_audio (HTTP: ref_audio; CLI: --reference-audio)" in str(
        refusal("base", voice="ryan", reference_audio=b"RIFF")
    )


def test_a_base_checkpoint_clones_in_context_with_a_transcript_and_from_the_vector_without():
    assert read("base", reference_audio=b"RIFF", reference_transcript="Hi.").in_context
    assert not read("base", reference_audio=b"RIFF").in_context


@pytest.mark.parametrize("kind", ["base", "voice_design"])
def test_checkpoints_without_preset_speakers_refuse_a_named_voice(kind):
    error = refusal(kind, voice="alloy", reference_audio=b"RIFF" if kind == "base" else None)
    assert error.code == "QWEN3_NO_PRESET_SPEAKERS"


@pytest.mark.parametrize("kind, size", [("base", "1b7"), ("custom_voice", "0b6")])
def test_instructions_are_refused_where_the_checkpoint_ignores_them(kind, size):
    error = refusal(kind, size, instructions="Whisper.", reference_audio=b"RIFF" if kind == "base" else None)
    assert error.code == "QWEN3_NO_INSTRUCTIONS"


@pytest.mark.parametrize("kind", ["voice_design", "custom_voice"])
def test_instructions_are_taken_from_the_request_or_its_options(kind):
    assert read(kind, instructions="Whisper.").instructions == "Whisper."
    assert read(kind, options={"instructions": "Shout."}).instructions == "Shout."


@pytest.mark.parametrize("kind", ["voice_design", "custom_voice"])
def test_instructions_may_be_as_long_as_the_text(kind):
    """They were cut at 1,000 characters, where the docs give them as many as the text (2,000)."""
    assert len(read(kind, instructions="x" * 2000).instructions) == 2000
    with pytest.raises(InvalidRequest, match="^instructions has 2001 characters; at most 2000, as the text$"):
        read(kind, instructions="x" * 2001)


def test_language_and_seed_options_are_checked():
    request = read("custom_voice", options={"language": "English", "seed": "42"})
    assert (request.language, request.seed) == ("english", 42)
    with pytest.raises(InvalidRequest, match="unsupported language 'klingon'") as refused:
        read("custom_voice", options={"language": "klingon"})
    assert refused.value.code == "QWEN3_UNKNOWN_LANGUAGE"  # over gRPC it was a bare INVALID_ARGUMENT
    with pytest.raises(InvalidRequest, match=r"option 'seed': must be within \[0, 9223372036854775807\], got -1$"):
        read("custom_voice", options={"seed": "-1"})
    # int() and float() read other scripts' digits and digit groups; no client means them.
    for option, value in (("seed", "٣"), ("seed", "1_0"), ("temperature", "٠.5"), ("top_k", "３0"), ("top_p", "0_1")):
        with pytest.raises(InvalidRequest, match=f"option '{option}'"):
            read("custom_voice", options={option: value})


def test_sampling_options_override_the_defaults_and_are_bounded():
    request = read("custom_voice", options={"temperature": "0.5", "do_sample": "false", "max_new_tokens": "64"})
    assert (request.sampling.temperature, request.sampling.do_sample, request.sampling.max_new_tokens) == (
        0.5,
        False,
        64,
    )
    with pytest.raises(InvalidRequest, match="option 'top_p'"):
        read("custom_voice", options={"top_p": "1.5"})


def test_whole_number_options_take_a_json_number_written_with_a_point_and_refuse_a_fraction():
    # A JSON client's 30.0 was refused with Python's own "invalid literal for int() with base 10: '30.0'".
    assert read("custom_voice", options={"top_k": "30.0", "subtalker_top_k": "7"}).sampling.top_k == 30
    with pytest.raises(InvalidRequest, match=r"^option 'top_k': expected a whole number, got 30.5$"):
        read("custom_voice", options={"top_k": "30.5"})
    with pytest.raises(InvalidRequest, match=r"^option 'top_p': expected a number, got high$"):
        read("custom_voice", options={"top_p": "high"})


@pytest.mark.parametrize("option", ["seed", "top_k", "max_new_tokens"])
def test_a_whole_number_option_that_is_no_number_is_refused_as_such(option):
    # It was refused with Python's own "could not convert string to float: 'abc'", naming a float.
    with pytest.raises(InvalidRequest, match=rf"^option '{option}': expected a whole number, got abc$"):
        read("custom_voice", options={option: "abc"})


@pytest.mark.parametrize(
    ("sample", "temperature"), [("do_sample", "temperature"), ("subtalker_dosample", "subtalker_temperature")]
)
def test_a_temperature_of_zero_is_greedy_decoding_only_where_that_part_does_not_sample(sample, temperature):
    # The package decodes greedily whatever the temperature when it does not sample; this refused 0 even then.
    request = read("custom_voice", options={sample: "false", temperature: "0"})
    assert getattr(request.sampling, temperature) == 0.0
    with pytest.raises(InvalidRequest, match=rf"^option '{temperature}': 0 is greedy decoding: set '{sample}' false"):
        read("custom_voice", options={temperature: "0"})
    with pytest.raises(InvalidRequest, match=rf"^option '{temperature}': must be 0 \(greedy decoding\) or within"):
        read("custom_voice", options={sample: "false", temperature: "1e-9"})


def test_a_request_may_ask_for_as_many_frames_as_the_checkpoint_gives_unasked():
    # The released checkpoints default to 8192 while a request could ask for 4096 at most.
    released = sampling_defaults({"max_new_tokens": 8192})
    assert read("custom_voice", defaults=released, options={"max_new_tokens": "8192"}).sampling.max_new_tokens == 8192
    with pytest.raises(InvalidRequest, match=r"^option 'max_new_tokens': must be within \[2, 8192\], got 8193$"):
        read("custom_voice", defaults=released, options={"max_new_tokens": "8193"})
    with pytest.raises(InvalidRequest, match=r"^option 'max_new_tokens': must be within \[2, 4096\], got 4097$"):
        read("custom_voice", options={"max_new_tokens": "4097"})


def test_an_unknown_option_is_refused_with_the_accepted_list():
    with pytest.raises(InvalidRequest, match="unknown option.*noise_scale.*accepted: language"):
        read("custom_voice", options={"noise_scale": "0"})


def test_empty_text_and_a_transcript_without_audio_are_refused():
    with pytest.raises(InvalidRequest, match="text is empty"):
        read("custom_voice", text="  ")
    # Before: "reference_transcript was given without reference_audio", as if the audio would have been taken.
    with pytest.raises(InvalidRequest, match="VoiceDesign checkpoint cannot clone a voice, so it takes no") as refused:
        read("voice_design", reference_transcript="Hi.")
    assert refused.value.code == "QWEN3_NO_CLONING"


def test_the_checkpoint_generation_config_fills_the_defaults_it_names():
    defaults = sampling_defaults({"temperature": 0.7, "max_new_tokens": 8192, "unrelated": 1})
    assert (defaults.temperature, defaults.max_new_tokens, defaults.top_k) == (0.7, 8192, 50)


def test_generation_config_values_are_read_as_request_options_and_refused_when_unusable():
    assert sampling_defaults({"top_k": "40", "do_sample": "false"}).top_k == 40  # a string the sampling cannot take
    with pytest.raises(ValueError, match=r"generation_config.json 'temperature': 0 is greedy decoding: set 'do_samp"):
        sampling_defaults({"temperature": 0})
    assert sampling_defaults({"temperature": 0, "do_sample": False}).temperature == 0.0
    with pytest.raises(ValueError, match=r"generation_config.json 'top_p': must be within \[0, 1\], got 2.0"):
        sampling_defaults({"top_p": 2})
    with pytest.raises(ValueError, match="generation_config.json holds list"):
        sampling_defaults([])  # type: ignore[arg-type]


def test_the_speech_api_top_level_seed_and_language_are_read():
    request = read("custom_voice", seed=9, language="Chinese")
    assert (request.seed, request.language) == (9, "chinese")


def test_max_new_tokens_of_one_is_refused_since_it_makes_no_frame():
    # The last first-codebook code drawn never gets its other 15 codebooks: n tokens make n - 1 frames.
    with pytest.raises(InvalidRequest, match=r"option 'max_new_tokens': must be within \[2, 4096\], got 1"):
        read("custom_voice", options={"max_new_tokens": "1"})
    assert read("custom_voice", options={"max_new_tokens": "2"}).sampling.max_new_tokens == 2


@pytest.mark.parametrize("option", ["length_scale", "speed"])
def test_a_speed_is_refused_with_its_own_code(option):
    # The HTTP API sends the OpenAI `speed` field as length_scale; the refusal must speak of speed.
    with pytest.raises(Unsupported) as caught:
        read("custom_voice", options={option: "0.5"})
    assert caught.value.code == "QWEN3_NO_SPEED"
    assert "`speed`" in str(caught.value) and "'length_scale'" not in str(caught.value)


def test_a_blank_transcript_or_instruction_counts_as_none():
    # In context, a blank transcript would tell the talker the reference audio says nothing.
    assert not read("base", reference_audio=b"RIFF", reference_transcript=" \n ").in_context
    assert read("custom_voice", "0b6", instructions="  ").instructions is None
    assert read("custom_voice", options={"language": " "}).language == "auto"


@pytest.mark.parametrize(
    "kind, size, request_fields, code, field",
    [
        ("custom_voice", "1b7", {"voice": "alloy"}, "QWEN3_UNKNOWN_SPEAKER", "voice"),
        ("voice_design", "1b7", {"voice": "alloy"}, "QWEN3_NO_PRESET_SPEAKERS", "voice"),
        ("custom_voice", "1b7", {"options": {"speed": "0.5"}}, "QWEN3_NO_SPEED", "speed"),
        ("custom_voice", "1b7", {"options": {"length_scale": "2"}}, "QWEN3_NO_SPEED", "length_scale"),
        ("custom_voice", "0b6", {"instructions": "Whisper."}, "QWEN3_NO_INSTRUCTIONS", "instructions"),
        ("custom_voice", "1b7", {"language": "klingon"}, "QWEN3_UNKNOWN_LANGUAGE", "language"),
        ("custom_voice", "1b7", {"reference_audio": b"RIFF"}, "QWEN3_NO_CLONING", "reference_audio"),
        ("voice_design", "1b7", {"reference_transcript": "Hi."}, "QWEN3_NO_CLONING", "reference_transcript"),
        ("base", "1b7", {}, "QWEN3_NEEDS_REFERENCE", "reference_audio"),
    ],
)
def test_each_refusal_reaches_the_gateway_with_its_code_and_field_apart_from_its_text(
    kind, size, request_fields, code, field
):
    """The code was only inside the text (`QWEN3_UNKNOWN_SPEAKER: unknown voice ...`): the worker's Failure frame
    carried no code, so no client could read one but by parsing the message. Once it travelled apart, the text still
    began with it, and a client read it twice (`rejected the request: QWEN3_NO_SPEED: Qwen3-TTS has no ...`). The
    field it is about did not travel at all: over HTTP, `param` was null."""
    import asyncio

    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import SINK, make_runtime, planned, submit

    class Preprocessing:  # what the Qwen3 executors do first: parse the request against the checkpoint
        async def process(self, payload, ctx):
            parse(payload.request, checkpoint(kind, size), Sampling())

    async def scenario():
        runtime = make_runtime([planned("preprocessing")], {"preprocessing": Preprocessing()})
        submit(runtime, "preprocessing", request={"text": "Hello.", "options": {}, **request_fields})
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK), timeout=10)
        return runtime.links.sent[SINK][-1].failure

    failure = asyncio.run(scenario())
    assert failure.client_code == code and code not in failure.client_message
    assert failure.client_field == field
    assert failure.client_message == str(refusal(kind, size, **request_fields))


def test_the_seed_range_the_stage_takes_is_the_one_the_model_declares_to_the_http_api():
    """HTTP refused Qwen3-TTS seeds past 2^32-1 that the stage, over gRPC, took up to 2^63-1; both follow the
    declaration now, and the stage's refusal names the range as the HTTP API's does."""
    from stagevisor.models.qwen3 import QWEN3_SPEECH
    from stagevisor.stages.qwen3.request import MAX_SEED

    assert QWEN3_SPEECH.seed and QWEN3_SPEECH.seed_maximum == MAX_SEED
    assert read("custom_voice", seed=MAX_SEED).seed == MAX_SEED
    assert read("custom_voice", options={"seed": "0"}).seed == 0
    with pytest.raises(InvalidRequest, match=rf"option 'seed': must be within \[0, {MAX_SEED}\], got {MAX_SEED + 1}"):
        read("custom_voice", seed=MAX_SEED + 1)


def test_a_base_checkpoints_one_voice_is_listed_as_not_usable_saying_why_as_its_requests_are_refused():
    """GET /v1/audio/voices listed a Base checkpoint's `default` (and the OpenAI names mapped onto it) as any
    voice, and every request naming it got 400 QWEN3_NEEDS_REFERENCE."""
    from stagevisor.stages.qwen3.request import NEEDS_REFERENCE, listed_voices

    (base,) = listed_voices(checkpoint("base"), 24000)
    assert base == {
        "id": "default",
        "name": "default",
        "sample_rate": 24000,
        "usable": False,
        "unusable_reason": NEEDS_REFERENCE,
    }
    assert refusal("base").args[0].endswith(NEEDS_REFERENCE)  # the same words as the request's refusal
    assert [v["id"] for v in listed_voices(checkpoint("custom_voice"), 24000)] == ["ryan", "vivian"]
    (design,) = listed_voices(checkpoint("voice_design"), 24000)
    assert "usable" not in design and design["id"] == "default"


@pytest.mark.parametrize(
    "options, field, code",
    [
        ({"top_k": "many"}, "top_k", "INVALID_OPTION"),
        ({"temperature": "0"}, "temperature", "INVALID_OPTION"),
        ({"subtalker_temperature": "0"}, "subtalker_temperature", "INVALID_OPTION"),
        ({"seed": "-1"}, "seed", "INVALID_OPTION"),
        ({"max_new_tokens": "1"}, "max_new_tokens", "INVALID_OPTION"),
        ({"instructions": "x" * 2001}, "instructions", "INVALID_OPTION"),
        ({"volume": "2", "pitch": "1"}, "pitch", "UNKNOWN_OPTION"),
    ],
)
def test_a_refused_option_is_named_as_the_field_at_fault_with_its_code(options, field, code):
    """These refusals named their field but carried no code: a client matched them by their text."""
    with pytest.raises(InvalidRequest) as caught:
        read("voice_design", options=options)
    assert (caught.value.field, caught.value.code) == (field, code)


@pytest.mark.parametrize("text, code", [(" ", "TEXT_EMPTY"), ("x" * 2001, "TEXT_TOO_LONG")])
def test_an_empty_or_too_long_text_names_the_text_field_with_its_code(text, code):
    with pytest.raises(InvalidRequest) as caught:
        read("custom_voice", text=text)
    assert (caught.value.field, caught.value.code) == ("text", code)
