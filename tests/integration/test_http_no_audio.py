"""A pipeline that ends without audio: every response_format still answers a stream a decoder opens.

The terminal stage (tests/integration/http_stages.py: Mute) streams nothing. WAV and FLAC are then their
header alone; MP3, Ogg Opus and AAC have no empty stream FFmpeg opens (they were 0 bytes, and Ogg gets only
its headers), so they carry the codec's shortest frame of silence.
"""

from __future__ import annotations

import io
import json
import urllib.request

import av
import numpy as np
import pytest

from tests.integration.daemon_helpers import DaemonProcess, make_plan

MUTE = "tests.integration.http_stages:make_mute"


@pytest.fixture(scope="module")
def daemon():
    plan = make_plan("mute", [("mute", "pipeline", None, None)], factories={"mute": MUTE})
    with DaemonProcess(plan, "--http", "127.0.0.1:0") as running:
        running.wait_serving()
        yield running


def speech(daemon: DaemonProcess, response_format: str) -> tuple[int, bytes]:
    body = json.dumps({"model": "mute", "input": "hello", "response_format": response_format}).encode()
    request = urllib.request.Request(
        daemon.http_url() + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, response.read()


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav"])
def test_a_request_the_pipeline_made_no_audio_for_is_a_stream_that_decodes_to_at_most_a_frame_of_silence(
    daemon, response_format
):
    status, data = speech(daemon, response_format)
    assert status == 200 and data
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].rate
        frames = list(container.decode(audio=0))
    samples = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0)
    assert samples.size / rate <= 0.1  # MP3 and AAC: a frame and the decoder's delay
    assert not np.any(samples)  # silence
    if response_format in ("flac", "wav"):
        assert samples.size == 0  # a format with an empty stream keeps it
