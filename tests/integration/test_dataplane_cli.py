"""`stagevisor synthesize` against a live Synthesis service: WAV output, summary line, exit codes."""

import asyncio
import os
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.integration.dataplane_stages import SAMPLE_RATE, split_chain

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def served():
    with split_chain() as started:
        yield started


def synthesize_cli(loop, *args, stdin: bytes | None = None, binary: bool = False):
    """Run the CLI in a subprocess while this process's event loop keeps serving the cluster (`binary`: its
    standard output as bytes)."""

    async def run():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "stagevisor",
            "synthesize",
            *args,
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(stdin), 60)
        return process.returncode, out if binary else out.decode(), err.decode()

    return loop.run_until_complete(run())


def test_synthesize_writes_a_16_bit_mono_wav_and_prints_a_summary(served, tmp_path):
    loop, cluster = served
    output = tmp_path / "out.wav"
    code, out, err = synthesize_cli(
        loop, "one two three", "-o", str(output), "--address", cluster.public, "--option", "noise_scale=0"
    )
    assert code == 0, err
    with wave.open(str(output)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SAMPLE_RATE)
        samples = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    assert len(samples) == 3 * 160 and np.abs(samples).max() > 0
    assert out.startswith(f"wrote {output}: 0.03 s of audio at {SAMPLE_RATE} Hz, first audio after")


def wav_samples(path: Path) -> np.ndarray:
    with wave.open(str(path)) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


def decoded(path: Path) -> tuple[str, int, np.ndarray]:
    """(codec, rate, mono samples as int16 where the codec's are) of an audio file, by FFmpeg (PyAV)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        return stream.codec_context.name, stream.rate, np.concatenate(frames) if frames else np.zeros(0)


def test_synthesize_writes_the_format_its_output_is_named_for(served, tmp_path):
    """FLAC and raw PCM hold the WAV's very samples; MP3, Opus and AAC decode as those codecs, with audio."""
    loop, cluster = served
    noiseless = ("--address", cluster.public, "--option", "noise_scale=0")
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.wav"), *noiseless)[0] == 0
    reference = wav_samples(tmp_path / "a.wav")
    for name, codec in (("a.flac", "flac"), ("a.mp3", "mp3float"), ("a.opus", "opus"), ("a.aac", "aac")):
        code, out, err = synthesize_cli(loop, "one two three", "-o", str(tmp_path / name), *noiseless)
        assert code == 0, err
        assert out.startswith(f"wrote {tmp_path / name} ({Path(name).suffix[1:]}): 0.03 s of audio at")
        found, rate, samples = decoded(tmp_path / name)
        assert found == codec and samples.size and np.abs(samples).max() > 0
        if codec == "flac":
            assert rate == SAMPLE_RATE and np.array_equal(samples, reference)
    code, _, err = synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.raw"), *noiseless)
    assert code == 0, err
    assert np.array_equal(np.frombuffer((tmp_path / "a.raw").read_bytes(), "<i2"), reference)


def test_synthesize_reads_the_text_from_standard_input_given_dash(served, tmp_path):
    loop, cluster = served
    args = ("-o", str(tmp_path / "piped.wav"), "--address", cluster.public, "--option", "noise_scale=0")
    code, _, err = synthesize_cli(loop, "-", *args, stdin=b"one two three\n")
    assert code == 0, err
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "argv.wav"), *args[2:])[0] == 0
    assert np.array_equal(wav_samples(tmp_path / "piped.wav"), wav_samples(tmp_path / "argv.wav"))


def test_synthesize_writes_the_audio_to_standard_output_given_dash(served, tmp_path):
    """`-o -`: the WAV on standard output (for a pipe to a player), the summary on standard error."""
    loop, cluster = served
    args = ("--address", cluster.public, "--option", "noise_scale=0")
    code, out, err = synthesize_cli(loop, "one two three", "-o", "-", *args, binary=True)
    assert code == 0, err
    assert err.startswith("wrote standard output: 0.03 s of audio at")
    assert synthesize_cli(loop, "one two three", "-o", str(tmp_path / "a.wav"), *args)[0] == 0
    assert out == (tmp_path / "a.wav").read_bytes()


def test_synthesize_exits_2_when_the_request_is_invalid(served):
    loop, cluster = served
    code, _, err = synthesize_cli(loop, "words", "--address", cluster.public, "--option", "bad=1", "-o", os.devnull)
    assert code == 2 and err.startswith(
        "error: synthesis failed (INVALID_ARGUMENT): stage 'tokenize' rejected the request: option 'bad'"
    )


def test_synthesize_exits_1_naming_the_address_when_no_daemon_listens(served, tmp_path):
    loop, _ = served
    address = f"unix:{tmp_path}/none.sock"
    code, _, err = synthesize_cli(loop, "words", "--address", address, "-o", os.devnull)
    assert code == 1 and f"cannot reach the daemon at {address}" in err


def test_synthesize_exits_1_when_a_stage_fails(served):
    loop, cluster = served
    code, _, err = synthesize_cli(loop, "boom", "--address", cluster.public, "-o", os.devnull)
    assert code == 1 and "stage 'engine' failed" in err
