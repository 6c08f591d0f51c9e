"""The Synthesis service's own checks and PCM conversion, and the synthesize CLI's option parsing."""

import numpy as np
import pytest

from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor.commands.synthesize import parse_options
from stagevisor.supervisor.dataplane.synthesis import (
    MAX_REFERENCE_AUDIO_BYTES,
    MAX_TEXT_CHARS,
    request_from_proto,
    split_pcm,
    to_pcm16,
)
from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest


def test_valid_request_becomes_the_payload_request_dict():
    message = spb.SynthesizeRequest(
        text="Hello.", voice="joe", reference_audio=b"RIFF", reference_transcript="hi", options={"noise_scale": "0"}
    )
    assert request_from_proto(message) == {
        "text": "Hello.",
        "voice": "joe",
        "reference_audio": b"RIFF",
        "reference_transcript": "hi",
        "options": {"noise_scale": "0"},
    }


@pytest.mark.parametrize(
    "message, complaint",
    [
        (spb.SynthesizeRequest(text="  \n"), "text is empty"),
        (spb.SynthesizeRequest(text="a" * (MAX_TEXT_CHARS + 1)), "limit is 5000"),
        (spb.SynthesizeRequest(text="a", reference_audio=b"0" * (MAX_REFERENCE_AUDIO_BYTES + 1)), "reference audio"),
        (spb.SynthesizeRequest(text="a", options={"bad key": "1"}), "malformed"),
        (spb.SynthesizeRequest(text="a", options={f"k{i}": "1" for i in range(33)}), "at most 32"),
        (spb.SynthesizeRequest(text="a", options={"k": "v" * 300}), "longer than"),
        (spb.SynthesizeRequest(text="hello\x00world"), r"text contains the control character '\\x00' at position 5"),
        (spb.SynthesizeRequest(text="a", reference_transcript="b\x1b[0m"), "reference_transcript contains"),
    ],
)
def test_invalid_requests_are_rejected_with_a_reason(message, complaint):
    with pytest.raises(InvalidSynthesisRequest, match=complaint):
        request_from_proto(message)


def test_tabs_and_line_breaks_are_ordinary_text():
    assert request_from_proto(spb.SynthesizeRequest(text="one\ttwo\r\nthree"))["text"] == "one\ttwo\r\nthree"


def test_pcm_conversion_clips_and_scales_to_int16_little_endian():
    pcm = to_pcm16(np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5], dtype=np.float32))
    assert np.frombuffer(pcm, "<i2").tolist() == [0, 32767, -32767, 32767, -32767, 16383]


def test_cli_options_parse_key_value_pairs_and_reject_malformed_ones():
    assert parse_options(["noise_scale = 0", "length_scale=1.2"]) == {"noise_scale": "0", "length_scale": "1.2"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_options(["noise_scale"])


def test_large_pcm_is_split_on_sample_boundaries_under_the_limit():
    pcm = bytes(range(256)) * 40  # 10240 bytes
    pieces = split_pcm(pcm, limit=1001)
    assert b"".join(pieces) == pcm
    assert all(len(p) <= 1001 and len(p) % 2 == 0 for p in pieces)
