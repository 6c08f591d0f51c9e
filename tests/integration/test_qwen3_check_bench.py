"""`stagevisor check` and `stagevisor bench` on a tiny random Qwen3-TTS Base checkpoint (tests/qwen3_tiny.py).

A Base checkpoint speaks only in a cloned voice: both commands failed every request (REQUEST_REFUSED,
REQUESTS_FAILED) until they could send reference audio. Scenario:
1. a Base checkpoint and a two-second reference clip are built;
2. `check --reference-audio --reference-transcript` builds every stage, runs its request and passes;
3. `bench --reference-audio` measures one request on the declared topology, with no error.
Needs the qwen3 extra; skipped without it (tests/markers.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
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


def stagevisor(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stagevisor", *argv],
        cwd=ROOT,
        # TMPDIR in tmp_path: torch writes a module file under it in each worker that it leaves behind.
        env={**daemon_env(tmp_path / "run"), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_check_runs_a_base_checkpoint_with_reference_audio(tmp_path, base):
    directory, reference = base
    result = stagevisor(
        tmp_path,
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
        tmp_path,
        *("bench", "--model-path", directory, "--text-file", str(texts), "--option", "max_new_tokens=10"),
        *("--concurrency", "1", "--requests", "1", "--warmup", "0", "--reference-audio", reference),
        "--format",
        "json",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [topology] = json.loads(result.stdout)["topologies"]
    assert topology["error"] is None
