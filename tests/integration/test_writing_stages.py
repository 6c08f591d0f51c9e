"""The worked example of docs/guides/writing-stages.md is the code in deploy/examples/my-tts, and it serves."""

from __future__ import annotations

import re

import grpc
import pytest

from tests.integration.daemon_helpers import ROOT, ServeProcess, synthesize

GUIDE = ROOT / "docs" / "guides" / "writing-stages.md"
EXAMPLE = ROOT / "deploy" / "examples" / "my-tts"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


def test_the_guide_shows_the_example_files_as_they_are():
    assert (EXAMPLE / "my_tts" / "stages.py").read_text() in blocks("python")
    assert (EXAMPLE / "my-tts.yaml").read_text() in blocks("yaml")


def test_the_guides_import_line_imports():
    [line] = [b for b in blocks("python") if b.startswith("from stagevisor.stages import")]
    exec(compile(line, str(GUIDE), "exec"), {})


@pytest.mark.slow  # daemons of its own: the guide's example declared and split
def test_the_example_serves_split_as_the_guide_says_and_rejects_a_bad_option():
    """Steps: serve the example with the vocoder isolated (as the guide's command does);
    five words at speed 2 are five tones of 0.1 s at 16 kHz; speed 9 is INVALID_ARGUMENT with the stage's message."""
    config = str(EXAMPLE / "my-tts.yaml")
    with ServeProcess("--config", config, "--isolate-stage", "vocoder") as daemon:
        daemon.wait_serving()
        assert [g["name"] for g in daemon.topology()["groups"]] == ["pipeline", "vocoder"]
        pcm, rate = synthesize(daemon.listen, "hello from my own stages", {"speed": "2"})
        assert rate == 16000 and len(pcm) == 2 * 5 * 1600
        with pytest.raises(grpc.RpcError) as raised:
            synthesize(daemon.listen, "too fast", {"speed": "9"})
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "speed must be in [0.25, 4], got 9.0" in raised.value.details()


@pytest.mark.slow  # a daemon of its own: the guide's example over HTTP
def test_the_examples_openai_speed_reaches_its_frontend_over_http():
    """Steps: serve the example with HTTP; OpenAI's `speed` field 2 makes five words five tones of 0.1 s, as the
    guide says, because the YAML declares the option `speed` (undeclared, it would arrive as `length_scale`)."""
    import json
    import urllib.request

    with ServeProcess("--config", str(EXAMPLE / "my-tts.yaml"), "--http", "127.0.0.1:0") as daemon:
        daemon.wait_serving()
        body = {"model": "my-tts", "input": "hello from my own stages", "speed": 2, "response_format": "pcm"}
        request = urllib.request.Request(
            f"{daemon.http_url()}/v1/audio/speech",
            data=json.dumps({**body, "sample_rate": 16000}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            pcm = response.read()
        assert len(pcm) == 2 * 5 * 1600
