"""Validation of a POST /v1/audio/speech body: OpenAI's fields, extra executor options, field-named errors."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.speech import parse_speech_request, to_payload

VOICES = [{"id": "en_US-joe-medium", "aliases": ["default", "joe"], "sample_rate": 22050}]


def parse(**fields):
    return parse_speech_request(
        {"model": "demo", "input": "Hello.", **fields}, models=("demo", "test/demo"), voices=VOICES
    )


def test_defaults_follow_openai():
    request = parse()
    assert (request.response_format, request.stream_format, request.voice, request.speed) == ("mp3", "audio", "", None)
    assert request.options == {}


def test_extra_fields_become_string_options_and_speed_becomes_a_length_scale():
    request = parse(noise_scale=0, noise_w=0.0, speed=2.0, flag=True, name="x")
    assert request.options == {"noise_scale": "0", "noise_w": "0.0", "length_scale": "0.5", "flag": "true", "name": "x"}
    assert "length_scale" not in parse(speed=1.0).options


def test_the_model_path_and_the_custom_voice_form_are_accepted():
    assert parse(model="test/demo", voice={"id": "joe"}).voice == "joe"


def test_instructions_reach_the_pipeline_request():
    payload = to_payload(parse(instructions="Speak slowly."))
    assert payload["instructions"] == "Speak slowly." and payload["text"] == "Hello."


@pytest.mark.parametrize(
    "fields,status,param",
    [
        ({"model": "tts-1"}, 404, "model"),
        ({"voice": "alloy"}, 400, "voice"),
        ({"voice": {"id": 3}}, 400, "voice"),
        ({"speed": 0.2}, 400, "speed"),
        ({"speed": "1"}, 400, "speed"),
        ({"speed": 2.0, "length_scale": 1}, 400, "speed"),
        ({"response_format": "MP3"}, 400, "response_format"),
        ({"stream_format": None}, 400, "stream_format"),
        ({"instructions": 5}, 400, "instructions"),
        ({"noise_scale": None}, 400, "noise_scale"),
        ({"noise_scale": {"a": 1}}, 400, "noise_scale"),
        ({"noise scale": 1}, 400, "noise scale"),
    ],
)
def test_bad_fields_are_named(fields, status, param):
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    assert (caught.value.status, caught.value.param) == (status, param)


def test_the_service_checks_of_grpc_apply_to_input():
    with pytest.raises(ApiError) as caught:
        to_payload(parse(input="x" * 5001))
    assert caught.value.param == "input" and caught.value.message.startswith("input has 5001 characters")
