"""Validation of a speech request body: OpenAI's fields, stagevisor's additions, model options, field-named errors."""

from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np
import pytest

from stagevisor.supervisor.config import OptionSpec, SpeechConfig
from stagevisor.supervisor.http.service import SpeechService
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.names import SpeechSettings, model_names, voice_map
from stagevisor.supervisor.http.reference import wav_bytes
from stagevisor.supervisor.http.body import parse_json_object
from stagevisor.supervisor.http.request import Served, parse_speech_request, to_payload
from stagevisor.supervisor.http.voices import StoredVoice
from tests.fakes import FakeSpeechDaemon

VOICES = [{"id": "en_US-joe-medium", "aliases": ["default", "joe"], "sample_rate": 22050}]
CLONES = SpeechConfig(
    clones=True,
    seed=True,
    languages=("en", "fr"),
    options={
        "temperature": OptionSpec(minimum=0, maximum=2),
        "top_k": OptionSpec(type="integer", minimum=1),
        "gain": OptionSpec(),
    },
)
UPLOADED = StoredVoice("mine", "hello there", 2.0, 0, audio=b"RIFF-mine")


DEFAULT_SPEECH = SpeechConfig()


def served(speech: SpeechConfig = DEFAULT_SPEECH, **kw) -> Served:
    defaults = dict(
        models=("demo", "test/demo", "tts-1"),
        voices=VOICES,
        voice_map=voice_map(VOICES, {}),
        uploaded=lambda name: UPLOADED if name == "mine" else None,
        speech=speech,
    )
    return Served(**{**defaults, **kw})


def parse(speech: SpeechConfig = DEFAULT_SPEECH, **fields):
    return parse_speech_request({"model": "demo", "input": "Hello.", **fields}, served(speech))


def reference_b64(seconds: float = 1.0) -> str:
    return base64.b64encode(wav_bytes(np.zeros(int(16000 * seconds), np.float32), 16000)).decode()


def test_defaults_follow_openai():
    request = parse()
    assert (request.response_format, request.stream_format, request.voice, request.speed) == ("mp3", "audio", "", None)
    assert request.options == {} and request.sample_rate is None


def test_pcm_defaults_to_24_khz_and_a_request_or_server_rate_wins():
    assert parse(response_format="pcm").sample_rate == 24000
    assert parse(response_format="pcm", sample_rate=16000).sample_rate == 16000
    assert parse_speech_request({"model": "demo", "input": "x"}, served(sample_rate=22050)).sample_rate == 22050


def test_extra_fields_become_string_options_and_speed_becomes_a_length_scale():
    request = parse(noise_scale=0, noise_w=0.0, speed=2.0, flag=True, name="x")
    assert request.options == {"noise_scale": "0", "noise_w": "0.0", "length_scale": "0.5", "flag": "true", "name": "x"}
    assert "length_scale" not in parse(speed=1.0).options


def test_openai_voice_names_map_to_the_models_voice_and_model_names_are_accepted():
    request = parse_speech_request({"model": "tts-1", "input": "x", "voice": "alloy"}, served())
    assert request.voice == "en_US-joe-medium"
    assert parse(model="test/demo", voice={"id": "joe"}).voice == "joe"
    assert parse(voice="marin").voice == parse(voice="cedar").voice == "en_US-joe-medium"


@pytest.mark.parametrize("voice", ["", "   "])
def test_an_empty_voice_is_the_models_default_voice_as_an_absent_one_is(voice):
    """As over gRPC (an empty voice is the model's default), not a voice named "" refused as unknown."""
    assert parse(voice=voice).voice == parse().voice == ""


def test_a_model_that_declares_no_voices_hands_any_name_to_its_stages():
    """Its stages judge the name (docs/guides/writing-stages.md); the config's map and OpenAI's names still apply:
    an OpenAI name stands for the default voice, a mapped name for what the config maps it onto."""
    undeclared = served(voices=[], voice_map=voice_map([], {"reader": "hearts"}))
    voices = {
        name: parse_speech_request({"model": "demo", "input": "x", "voice": name}, undeclared).voice
        for name in ("Narrator-2", "reader", "alloy")
    }
    assert voices == {"Narrator-2": "Narrator-2", "reader": "hearts", "alloy": ""}


def test_a_dated_openai_model_snapshot_is_accepted_as_the_served_model():
    """Before: `gpt-4o-mini-tts-2025-12-15`, a model the openai SDK's SpeechModel type lists, was 404
    model_not_found for a client pinned to it."""
    models = model_names("demo", None, SpeechSettings())
    request = parse_speech_request({"model": "gpt-4o-mini-tts-2025-12-15", "input": "x"}, served(models=models))
    assert request.model == "gpt-4o-mini-tts-2025-12-15"


def test_an_uploaded_voice_becomes_the_reference_of_a_cloning_model():
    request = parse(CLONES, voice="mine")
    assert (request.reference_audio, request.reference_text, request.voice) == (b"RIFF-mine", "hello there", "")


def test_ref_audio_is_decoded_checked_and_rewritten_as_wav():
    request = parse(CLONES, ref_audio="data:audio/wav;base64," + reference_b64(), ref_text="hi")
    assert request.reference_audio[:4] == b"RIFF" and request.reference_text == "hi"
    payload = to_payload(request)
    assert payload["reference_audio"] == request.reference_audio and payload["reference_transcript"] == "hi"


def test_a_declared_voice_is_matched_case_insensitively_and_sent_as_declared():
    assert parse(voice="JOE").voice == "joe"
    assert parse(voice="En_US-Joe-Medium").voice == "en_US-joe-medium"


def test_an_uploaded_voice_named_like_a_models_voice_in_another_case_does_not_take_its_requests():
    """A voice `JOE` stored (before uploads refused such a name) took the requests for the model's `joe`: 400
    cloning_not_supported on a model that does not clone, the upload's clone on one that does. A voice `alloy` stored
    (before the map used the name) took OpenAI's name likewise."""
    shadows = {name: StoredVoice(name, "hello", 2.0, 0, audio=b"RIFF-" + name.encode()) for name in ("JOE", "alloy")}
    for speech in (DEFAULT_SPEECH, CLONES):
        uploads = served(speech, uploaded=shadows.get)
        assert parse_speech_request({"model": "demo", "input": "x", "voice": "JOE"}, uploads).voice == "joe"
        request = parse_speech_request({"model": "demo", "input": "x", "voice": "alloy"}, uploads)
        assert (request.voice, request.reference_audio) == ("en_US-joe-medium", b"")


def test_a_language_is_matched_case_insensitively_and_sent_as_declared():
    assert to_payload(parse(CLONES, language="FR"))["language"] == "fr"


def test_declared_options_language_and_seed_reach_the_payload():
    payload = to_payload(parse(CLONES, temperature=0.5, top_k=3, language="fr", seed=7, instructions="Whisper."))
    assert payload["options"] == {"temperature": "0.5", "top_k": "3"}
    assert (payload["language"], payload["seed"], payload["instructions"]) == ("fr", 7, "Whisper.")


def test_a_whole_number_written_as_a_float_is_taken_for_an_integer_and_sent_as_one():
    """Before: `"top_k": 30.0` (how JavaScript, and many JSON encoders, write a whole number held as a float) was
    400 "must be of type integer", while gRPC's option "30.0" reached the stage and was taken as 30."""
    request = parse(CLONES, top_k=30.0, seed=7.0, sample_rate=16000.0)
    assert request.options == {"top_k": "30"}
    assert (request.seed, request.sample_rate) == (7, 16000)
    assert type(request.seed) is int and type(request.sample_rate) is int
    assert to_payload(request)["options"] == {"top_k": "30"}


@pytest.mark.parametrize("value", [30.5, float("nan"), True])  # inf (1e400) is refused as not finite, below
def test_a_fraction_or_what_is_no_number_is_refused_for_an_integer_option_naming_it(value):
    with pytest.raises(ApiError) as caught:
        parse(CLONES, top_k=value)
    assert (caught.value.param, caught.value.code) == ("top_k", "invalid_type")
    assert str(caught.value).startswith("option 'top_k' must be of type integer")


def test_a_whole_float_out_of_an_integer_options_range_names_the_range():
    with pytest.raises(ApiError, match=r"option top_k 0.0 is out of range; use 1 to inf$"):
        parse(CLONES, top_k=0.0)
    with pytest.raises(ApiError, match=r"seed 4294967296.0 is out of range; use 0 to 4294967295$"):
        parse(CLONES, seed=2.0**32)


@pytest.mark.parametrize(
    "speech,fields,status,param,code",
    [
        (SpeechConfig(), {"model": "gpt-5"}, 404, "model", "model_not_found"),
        (SpeechConfig(), {"voice": "nobody"}, 400, "voice", "voice_not_found"),
        (SpeechConfig(), {"voice": {"id": 3}}, 400, "voice", "invalid_type"),
        (SpeechConfig(), {"voice": "mine"}, 400, "voice", "cloning_not_supported"),
        (SpeechConfig(), {"ref_audio": "AAAA"}, 400, "ref_audio", "cloning_not_supported"),
        (SpeechConfig(), {"ref_text": "hi"}, 400, "ref_text", "invalid_value"),
        (CLONES, {"ref_audio": "not base64!"}, 400, "ref_audio", "invalid_audio"),
        (CLONES, {"ref_audio": 5}, 400, "ref_audio", "invalid_type"),
        (CLONES, {"voice": "mine", "ref_audio": "AAAA"}, 400, "ref_audio", "invalid_value"),
        (SpeechConfig(), {"seed": 1}, 400, "seed", "unsupported"),
        (CLONES, {"seed": -1}, 400, "seed", "invalid_value"),
        (CLONES, {"seed": 1.5}, 400, "seed", "invalid_type"),
        (SpeechConfig(), {"language": "en"}, 400, "language", "unsupported"),
        (CLONES, {"language": "de"}, 400, "language", "invalid_value"),
        (CLONES, {"temperature": 3}, 400, "temperature", "invalid_value"),
        (CLONES, {"top_k": 1.5}, 400, "top_k", "invalid_type"),
        (CLONES, {"noise_scale": 0}, 400, "noise_scale", "unknown_parameter"),
        (SpeechConfig(), {"sample_rate": 4000}, 400, "sample_rate", "invalid_value"),
        (SpeechConfig(), {"sample_rate": 16000.5}, 400, "sample_rate", "invalid_type"),
        (SpeechConfig(), {"speed": 0.2}, 400, "speed", "invalid_value"),
        (SpeechConfig(), {"speed": "1"}, 400, "speed", "invalid_type"),
        (SpeechConfig(), {"speed": 2.0, "length_scale": 1}, 400, "speed", "invalid_value"),
        (SpeechConfig(), {"response_format": "MP3"}, 400, "response_format", "invalid_value"),
        (SpeechConfig(), {"model": None}, 400, "model", "missing_required_parameter"),
        (SpeechConfig(), {"input": None}, 400, "input", "missing_required_parameter"),
        (SpeechConfig(), {"instructions": 5}, 400, "instructions", "invalid_type"),
        (SpeechConfig(), {"instructions": "Speak \ud800 slowly."}, 400, "instructions", "invalid_value"),
        (SpeechConfig(), {"noise_scale\n": 1}, 400, "noise_scale\n", "unknown_parameter"),
        (SpeechConfig(), {"noise_scale": {"a": 1}}, 400, "noise_scale", "invalid_type"),
        (SpeechConfig(), {"noise scale": 1}, 400, "noise scale", "unknown_parameter"),
    ],
)
def test_bad_fields_are_named(speech, fields, status, param, code):
    with pytest.raises(ApiError) as caught:
        parse(speech, **fields)
    assert (caught.value.status, caught.value.param, caught.value.code) == (status, param, code)


@pytest.mark.parametrize(
    "voice, message",
    [
        ({"id": None}, """'voice' as an object is OpenAI's {"id": string}; its 'id' is null"""),
        ({"id": 3}, """'voice' as an object is OpenAI's {"id": string}; its 'id' is a number"""),
        ({"id": "joe", "name": "Joe"}, "has no other key; it has the keys 'id', 'name'"),
        ({}, """'voice' as an object is OpenAI's {"id": string} and has no other key; it is empty"""),
        (["joe"], """'voice' must be a string or {"id": string}, got an array"""),
    ],
)
def test_a_voice_of_a_wrong_type_is_told_what_is_wrong_in_it(voice, message):
    """An object sent as the voice was told it must be a string or {"id": string}, 'got an object' (or 'got null'
    for {"id": null}), which reads as if it had sent no object, or no voice."""
    with pytest.raises(ApiError) as caught:
        parse(voice=voice)
    assert (caught.value.param, caught.value.code) == ("voice", "invalid_type")
    assert message in caught.value.message


@pytest.mark.parametrize(
    "instructions, message",
    [
        ("x" * 5001, "'instructions' has 5001 characters; the limit is 5000"),
        ("Speak\x07 slowly.", "'instructions' contains the control character '\\x07' at position 5; remove it"),
    ],
)
def test_instructions_too_long_or_with_a_control_character_are_told_apart(instructions, message):
    """Both read "'instructions' must be at most 5000 characters without control characters"."""
    with pytest.raises(ApiError) as caught:
        parse(SpeechConfig(), instructions=instructions)
    assert (caught.value.param, caught.value.code, caught.value.message) == ("instructions", "invalid_value", message)


@pytest.mark.parametrize(
    "languages, code, message",
    [
        # Before: `language 'en' is not one this model speaks: none (the model has one language)`; and its code was
        # invalid_value, where a `seed` to a model that takes none is `unsupported`.
        (
            (),
            "unsupported",
            "this model takes no 'language': it lists no languages to choose from (GET /v1/models lists what it "
            "takes); drop the field",
        ),
        (("english",), "invalid_value", "language 'en' is not one this model speaks: it speaks only english"),
        (("fr", "de"), "invalid_value", "language 'en' is not one this model speaks; use one of fr, de"),
    ],
)
def test_a_language_the_model_does_not_take_is_refused_saying_what_it_takes(languages, code, message):
    with pytest.raises(ApiError) as caught:
        parse(SpeechConfig(languages=languages), language="en")
    assert (caught.value.param, caught.value.code, caught.value.message) == ("language", code, message)


OPTIONAL_FIELDS = ("voice", "instructions", "response_format", "speed", "stream_format", "sample_rate", "language")


@pytest.mark.parametrize("field", [*OPTIONAL_FIELDS, "seed", "ref_audio", "ref_text", "temperature", "noise_scale"])
def test_null_on_an_optional_field_is_the_field_not_given(field):
    """As OpenAI's API takes it (its SDKs and other clients send explicit nulls); `"instructions": null` was 400
    "'instructions' is required"."""
    assert parse(CLONES, **{field: None}) == parse(CLONES)


def test_the_chat_apis_stream_field_is_refused_pointing_to_stream_format():
    """Clients that send `"stream": true` got the model's option list; the speech API streams anyway."""
    with pytest.raises(ApiError) as caught:
        parse(CLONES, stream=True)  # a model that declares its options, as every built-in one does
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, "stream", "unknown_parameter")
    assert 'always streams the audio as it is made; for events, send "stream_format": "sse"' in str(caught.value)
    streams = SpeechConfig(options={"stream": OptionSpec(type="boolean")})
    assert parse(streams, stream=True).options == {"stream": "true"}  # a model's own option of that name


def test_an_out_of_range_integer_names_its_range_exactly():
    with pytest.raises(ApiError, match=r"seed -1 is out of range; use 0 to 4294967295$"):
        parse(CLONES, seed=-1)
    with pytest.raises(ApiError, match=r"speed 0.2 is out of range; use 0.25 to 4$"):
        parse(SpeechConfig(), speed=0.2)
    tokens = SpeechConfig(options={"max_new_tokens": OptionSpec(type="integer", minimum=1, maximum=10_000_000)})
    with pytest.raises(ApiError, match=r"option max_new_tokens 0 is out of range; use 1 to 10000000$"):
        parse(tokens, max_new_tokens=0)


@pytest.mark.parametrize(
    "body, message",
    [
        # Before: `speed inf is out of range`, a value the client did not send.
        (
            '"speed": 1e400',
            "speed must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use 0.25 to 4",
        ),
        (
            '"speed": -1e400',
            "speed must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use 0.25 to 4",
        ),
        (
            '"temperature": 1e400',
            "option temperature must be a finite number (it is past 1.8e308, the most a 64-bit float holds); "
            "use 0 to 2",
        ),
        # Before: "'seed' must be an integer, got a number", and an unbounded number option took inf.
        (
            '"seed": 1e400',
            "seed must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use 0 to 4294967295",
        ),
        (
            '"gain": -1e400',
            "option gain must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use -inf to inf",
        ),
    ],
)
def test_a_number_past_what_a_float_holds_is_refused_as_not_finite_not_shown_as_inf(body, message):
    data = parse_json_object('{"model": "demo", "input": "Hello.", ' + body + "}")
    with pytest.raises(ApiError) as caught:
        parse_speech_request(data, served(CLONES))
    assert (caught.value.code, caught.value.message) == ("invalid_value", message)


def test_an_integer_option_just_past_a_bound_beyond_2_to_the_53_is_refused():
    """The bound was kept as a float, and 2^63-1 as a float is 2^63: a request for 2^63 passed the HTTP check."""
    big = SpeechConfig(options={"steps": OptionSpec(type="integer", minimum=0, maximum=2**63 - 1)})
    assert parse(big, steps=2**63 - 1).options == {"steps": str(2**63 - 1)}
    with pytest.raises(
        ApiError, match=r"option steps 9223372036854775808 is out of range; use 0 to 9223372036854775807$"
    ):
        parse(big, steps=2**63)


def test_the_seed_range_is_the_one_the_model_declares():
    """Before: every model's seed was refused past 2^32-1 over HTTP, while Qwen3-TTS takes up to 2^63-1 (over gRPC
    too): the same request was refused on one surface and served on the other."""
    wide = SpeechConfig(seed=True, seed_maximum=2**63 - 1)
    assert parse(wide, seed=2**40).seed == 2**40
    with pytest.raises(ApiError, match=r"seed 9223372036854775808 is out of range; use 0 to 9223372036854775807$"):
        parse(wide, seed=2**63)
    narrow = SpeechConfig(seed=True, seed_maximum=99)
    with pytest.raises(ApiError, match=r"seed 100 is out of range; use 0 to 99$"):
        parse(narrow, seed=100)


def test_a_reference_too_long_is_refused_with_its_code():
    with pytest.raises(ApiError) as caught:
        parse(CLONES, ref_audio=reference_b64(31))
    assert (caught.value.param, caught.value.code) == ("ref_audio", "audio_too_long")


def test_the_service_checks_of_grpc_apply_to_input():
    with pytest.raises(ApiError) as caught:
        to_payload(parse(input="x" * 5001))
    assert caught.value.param == "input" and caught.value.message.startswith("input has 5001 characters")


@pytest.mark.parametrize("field", ["model", "voice", "response_format", "stream_format", "language"])
def test_a_refused_value_is_quoted_back_cut_short_not_whole(field):
    """A 5 MB value in one of these fields came back whole in the error's message."""
    with pytest.raises(ApiError) as caught:
        parse(CLONES, **{field: "x" * 100_000})
    assert caught.value.param == field and len(caught.value.message) < 400, caught.value.message
    assert "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'" in caught.value.message


def test_models_lists_only_the_fields_a_request_to_this_model_may_carry():
    """`seed` and `language` were listed for a model that refuses them with a 400, as `ref_audio` was not."""
    from stagevisor.supervisor.config import SpeechConfig
    from stagevisor.supervisor.http.fields import FIELDS, accepted_fields

    plain = accepted_fields(SpeechConfig())
    assert not {"ref_audio", "ref_text", "seed", "language"} & set(plain)
    assert {"model", "input", "voice", "instructions", "speed"} <= set(plain)
    assert "speed" not in accepted_fields(SpeechConfig(speed=False))  # Qwen3-TTS: no speaking rate
    everything = SpeechConfig(clones=True, instructions=True, seed=True, languages=("English",))
    assert accepted_fields(everything) == list(FIELDS)


def test_a_voice_the_config_maps_onto_no_voice_of_the_model_says_so():
    """The config's `voices: {bad: nobody}`: a client sending `bad` was told only that it is not available."""
    from stagevisor.supervisor.http.errors import ApiError

    mapped = served(voice_map=voice_map(VOICES, {"bad": "nobody"}))
    with pytest.raises(ApiError) as caught:
        parse_speech_request({"model": "demo", "input": "x", "voice": "bad"}, mapped)
    assert caught.value.code == "voice_not_found"
    assert "voice 'bad' is not available (it stands for 'nobody' in the config's `voices`" in caught.value.message


def test_an_uploaded_voice_named_in_openais_id_form_is_read_off_the_event_loop():
    """Before: `"voice": {"id": "mine"}` (how OpenAI names a custom voice) read the uploaded voice's files on the
    event loop, which streams every other request's audio; `"voice": "mine"` was already read in a thread."""
    readers: list[threading.Thread] = []

    class Store:
        def find(self, name: str) -> StoredVoice | None:
            readers.append(threading.current_thread())
            return UPLOADED if name == "mine" else None

    service = SpeechService(FakeSpeechDaemon(), SpeechSettings(speech=CLONES), Store())  # type: ignore[arg-type]
    for voice in ("mine", {"id": "mine"}):
        request, _ = asyncio.run(service.parse({"model": "fake", "input": "Hello.", "voice": voice}))
        assert request.reference_audio == UPLOADED.audio
    assert len(readers) == 2 and threading.main_thread() not in readers


NO_SPEED = SpeechConfig(speed=False, seed=True)


@pytest.mark.parametrize("speed", [0.5, 2, 4.0])
def test_a_speed_is_refused_up_front_naming_the_field_by_a_model_without_a_speaking_rate(speed):
    """Qwen3-TTS: `speed` went to the stage as length_scale and came back as QWEN3_NO_SPEED with `param` null."""
    with pytest.raises(ApiError) as caught:
        parse(NO_SPEED, speed=speed)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, "speed", "invalid_value")
    assert "no speaking-rate control" in caught.value.message and "leave out 'speed' or send 1" in caught.value.message


def test_a_speed_of_one_changes_nothing_and_passes_a_model_without_a_speaking_rate():
    for speed in (1, 1.0, None):
        request = parse(NO_SPEED, speed=speed)
        assert "length_scale" not in request.options and "speed" not in request.options
    with pytest.raises(ApiError) as caught:  # the range is still checked first
        parse(NO_SPEED, speed=0.1)
    assert "out of range" in caught.value.message


def test_models_says_whether_the_model_takes_a_speed():
    from starlette.testclient import TestClient

    from stagevisor.supervisor.http.app import create_app

    for speech, takes in ((SpeechConfig(), True), (NO_SPEED, False)):
        client = TestClient(create_app(FakeSpeechDaemon(), settings=SpeechSettings(speech=speech)))
        accepts = client.get("/v1/models").json()["data"][0]["accepts"]
        assert (accepts["speed"], "speed" in accepts["fields"]) == (takes, takes)


def test_a_websocket_start_with_a_speed_the_model_cannot_take_ends_with_the_error_not_done():
    """Its `start` with `speed` then `end` and no text ended with `done`: the speed was never checked."""
    from starlette.testclient import TestClient

    from stagevisor.supervisor.http.app import create_app

    client = TestClient(create_app(FakeSpeechDaemon(), settings=SpeechSettings(speech=NO_SPEED)))
    with client.websocket_connect("/v1/audio/speech/stream") as websocket:
        websocket.send_json({"type": "start", "speed": 1.5})
        websocket.send_json({"type": "end"})
        event = websocket.receive_json()
    assert event["type"] == "error", event
    assert (event["error"]["param"], event["error"]["code"]) == ("speed", "invalid_value")
