"""`stagevisor check` and `stagevisor bench` on tiny random Qwen3-TTS checkpoints (tests/qwen3_tiny.py).

A Base checkpoint speaks only in a cloned voice: both commands failed every request (REQUEST_REFUSED,
REQUESTS_FAILED) until they could send reference audio. Scenario:
1. a Base checkpoint and a two-second reference clip are built;
2. `check --reference-audio --reference-transcript` builds every stage, runs its request and passes;
3. `bench --reference-audio` measures one request on the declared topology, with no error;
4. `check --edge tts_engine,vocoder` on a CustomVoice checkpoint, given no seed, finds the split edge identical
   (the model's declared seed is pinned: without it preprocessing drew a random one per run, an EDGE_MISMATCH).
Needs the qwen3 extra; skipped without it (tests/markers.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from tests.integration.daemon_helpers import ROOT, daemon_env

pytestmark = [pytest.mark.qwen3, pytest.mark.worker_torch, pytest.mark.timeout(600)]

TRANSCRIPT = "A reference transcript for voice cloning."


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, str]:
    from stagevisor.stages.qwen3.executors import reference_wav
    from tests.qwen3_tiny import build

    root = tmp_path_factory.mktemp("qwen3")
    reference = root / "reference.wav"
    noise = 0.2 * np.random.default_rng(0).standard_normal(16000 * 2)
    reference.write_bytes(reference_wav(noise.astype(np.float32), 16000))
    return str(build(root / "base", "base")), str(reference)


def stagevisor(*argv: str) -> subprocess.CompletedProcess:
    # A short TMPDIR of its own (`check --edge` puts its daemons' sockets under it), removed after: torch writes a
    # module file under it in each worker and leaves it behind.
    with tempfile.TemporaryDirectory(prefix="svq") as tmp:
        return subprocess.run(
            [sys.executable, "-m", "stagevisor", *argv],
            cwd=ROOT,
            env={**daemon_env(Path(tmp) / "run"), "TMPDIR": tmp},
            capture_output=True,
            text=True,
            timeout=400,
        )


def test_check_runs_a_base_checkpoint_with_reference_audio(base):
    directory, reference = base
    result = stagevisor(
        *("check", "--model-path", directory, "--text", "Hello there.", "--option", "max_new_tokens=10"),
        *("--reference-audio", reference, "--reference-transcript", TRANSCRIPT, "--format", "json"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True


def test_bench_measures_a_base_checkpoint_with_reference_audio(tmp_path, base):
    directory, reference = base
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello there.\n")
    result = stagevisor(
        *("bench", "--model-path", directory, "--text-file", str(texts), "--option", "max_new_tokens=10"),
        *("--concurrency", "1", "--requests", "1", "--warmup", "0", "--reference-audio", reference),
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [topology] = json.loads(result.stdout)["topologies"]
    assert topology["error"] is None


def test_check_pins_qwen3s_seed_so_a_split_edge_compares_identical(tmp_path_factory):
    from tests.qwen3_tiny import build

    directory = str(build(tmp_path_factory.mktemp("qwen3") / "custom_voice", "custom_voice"))
    result = stagevisor(
        *("check", "--model-path", directory, "--edge", "tts_engine,vocoder", "--text", "Hello there."),
        *("--option", "max_new_tokens=10", "--jobs", "1", "--format", "json"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [verdict] = json.loads(result.stdout)["edge_checks"]
    assert verdict["identical"] is True, verdict
