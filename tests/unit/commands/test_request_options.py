"""--voice, --reference-audio and --reference-transcript on `check` and `bench`, as `synthesize` names them: read and
checked before anything starts, then carried by every request (a Qwen3-TTS Base checkpoint speaks only in a cloned
voice, so without them neither command could run one)."""

from __future__ import annotations

import importlib
import json

import pytest

from stagevisor.supervisor.cli import build_parser, main
from stagevisor.supervisor.commands import bench, bench_options

HERE = "tests.unit.commands.test_request_options"
SEEN: list[dict] = []


class Recorder:
    """A one-stage pipeline's only stage: records the request it is given and speaks a little silence."""

    async def process(self, payload, ctx):
        import numpy as np

        SEEN.append(dict(payload.request))
        await ctx.stream({"audio": np.zeros(8, dtype=np.float32), "sample_rate": 16000})
        return None


def make_recorder(**args):
    return Recorder()


@pytest.fixture
def recorded(monkeypatch):
    """`check` on a pipeline of one recording stage (in this process: no worker, no daemon)."""
    import stagevisor.supervisor.commands.placement_options as plan_command
    from tests.integration.daemon_helpers import make_plan

    plan = make_plan("t", [("voice", "pipeline", None, None)], factories={"voice": f"{HERE}:make_recorder"})
    monkeypatch.setattr(plan_command, "plan_from_args", lambda args: plan)
    # The list of the module as the factory path imports it (pytest may have imported this file by another name).
    seen = importlib.import_module(HERE).SEEN
    seen.clear()
    yield seen
    seen.clear()


def half_second_wav(width: int = 2) -> bytes:
    """0.5 s of 16 kHz mono silence as a WAV file of `width`-byte samples."""
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(width)
        wav.setframerate(16000)
        wav.writeframes(bytes(width * 8000))
    return buffer.getvalue()


def test_check_sends_the_voice_the_reference_audio_and_its_transcript_with_its_request(tmp_path, recorded):
    reference = tmp_path / "ref.wav"
    reference.write_bytes(half_second_wav())
    argv = ["check", "--text", "Hi.", "--voice", "ryan", "--reference-audio", str(reference)]
    assert main([*argv, "--reference-transcript", "What it says."]) == 0
    [request] = recorded
    assert (request["voice"], request["reference_audio"], request["reference_transcript"]) == (
        "ryan",
        half_second_wav(),
        "What it says.",
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"ID3\x04\x00 an mp3 file", "this one is no WAV file"),
        (half_second_wav(width=3), "uses 24-bit samples; 8, 16 or 32-bit PCM is accepted"),
    ],
)
@pytest.mark.parametrize("command", ["check", "bench", "synthesize"])
def test_a_reference_the_stages_cannot_read_is_refused_before_anything_starts_saying_how_to_convert_it(
    tmp_path, capsys, recorded, monkeypatch, command, content, why
):
    """An MP3 or a 24-bit WAV was sent, and refused by the stage once the model had loaded (check: after building
    every stage), without the advice a float WAV got."""
    monkeypatch.setattr(bench, "_one", lambda *args: pytest.fail("bench measured a topology"))
    reference = tmp_path / "ref.audio"
    reference.write_bytes(content)
    text = ["Hi."] if command == "synthesize" else []
    where = ["--address", f"unix:{tmp_path}/none.sock"] if command == "synthesize" else []
    assert main([command, *text, "--reference-audio", str(reference), *where]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --reference-audio {reference}: reference_audio ") and why in err, err
    assert "convert it to 16-bit PCM (`ffmpeg -i IN -c:a pcm_s16le out.wav`)" in err
    assert recorded == [], "check built and ran its pipeline before refusing the reference"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reference-audio", "/nonexistent.wav"], "cannot read --reference-audio /nonexistent.wav: No such file"),
        (["--reference-transcript", "Words."], "--reference-transcript is the transcript of --reference-audio, which"),
    ],
)
@pytest.mark.parametrize("command", ["check", "bench"])
def test_a_reference_that_cannot_be_sent_is_refused_before_anything_starts(
    capsys, recorded, monkeypatch, command, argv, message
):
    monkeypatch.setattr(bench, "_one", lambda *args: pytest.fail("bench measured a topology"))
    assert main([command, *argv, "--format", "json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == "INVALID_CONFIG" and error["message"].startswith(message)
    assert recorded == [], "check built and ran its pipeline before refusing the options"


def test_bench_sends_the_voice_fields_with_every_request(tmp_path):
    from stagevisor.supervisor.bench.loadgen import VoiceFields

    reference = tmp_path / "ref.wav"
    reference.write_bytes(half_second_wav())
    args = build_parser().parse_args(
        ["bench", "--voice", "v", "--reference-audio", str(reference), "--reference-transcript", "T"]
    )
    assert bench_options.workload_from_args(args).voice == VoiceFields("v", half_second_wav(), "T")
    assert bench_options.workload_from_args(build_parser().parse_args(["bench"])).voice == VoiceFields()


@pytest.mark.parametrize("command", ["synthesize", "check", "bench"])
def test_the_three_commands_name_the_request_options_alike(command):
    usage = build_parser().commands[command].format_usage()
    for flag in ("--voice VOICE", "--reference-audio F.wav", "--reference-transcript T", "--option KEY=VALUE"):
        assert flag in usage
