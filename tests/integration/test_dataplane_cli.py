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


def synthesize_cli(loop, *args):
    """Run the CLI in a subprocess while this process's event loop keeps serving the cluster."""

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
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), 60)
        return process.returncode, out.decode(), err.decode()

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
