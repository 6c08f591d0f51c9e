"""`stagevisor serve` for Qwen3-TTS stops before any worker starts when its checkpoint is not there.

Runs in any environment: without the qwen3 extra the error names the extra
too; either way the checkpoint's message names every path searched, and
nothing (runtime directory, admin socket) is created.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.daemon_helpers import ROOT, daemon_env


@pytest.mark.parametrize("model_path", ["qwen3-tts", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"])
def test_a_missing_checkpoint_stops_serve_before_any_worker_naming_the_paths_searched(tmp_path, model_path):
    never = tmp_path / "never"
    env = {**daemon_env(never / "run"), "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-m", "stagevisor", "serve", "--model-path", model_path, "--admin-address", f"unix:{never}/a"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "QWEN3_NO_CHECKPOINT" in result.stderr and str(tmp_path / "cache") in result.stderr
    assert not never.exists(), "serve created its runtime or admin socket directory before the check"
