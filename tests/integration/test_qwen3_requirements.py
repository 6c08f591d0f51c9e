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


def test_a_config_json_without_talker_config_is_named_by_plan_and_refused_by_check_and_serve(tmp_path):
    """Before: `plan` and `check` read it as a checkpoint with no speakers and only `auto`, and only the start
    refused it (QWEN3_BAD_CHECKPOINT), once a worker had built the package's default talker from it. Now all three
    say the same before any worker starts: `plan` as a warning (it may plan for another host), the others refuse."""
    import json

    from tests.qwen3_tiny import write_checkpoint

    directory = write_checkpoint(tmp_path / "checkpoint")
    config = json.loads((directory / "config.json").read_text())
    del config["talker_config"]
    (directory / "config.json").write_text(json.dumps(config))
    expected = (
        f"QWEN3_BAD_CHECKPOINT: {str(directory / 'config.json')!r} does not describe a model its weights load into "
        "(it has no talker_config); restore the checkpoint's own config.json"
    )
    never = tmp_path / "never"

    def stagevisor(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "stagevisor", *args, "--model-path", str(directory)]
        env = daemon_env(never / "run")
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    planned = stagevisor("plan", "--format", "json")
    assert planned.returncode == 0, planned.stderr
    assert [w for w in json.loads(planned.stdout)["warnings"] if expected in w], planned.stdout
    checked = stagevisor("check", "--format", "json")
    assert checked.returncode == 1, checked.stderr
    refusals = [v for v in json.loads(checked.stdout)["violations"] if v["code"] == "MISSING_REQUIREMENT"]
    assert [expected in v["message"] for v in refusals] == [True]
    served = stagevisor("serve", "--admin-address", f"unix:{never}/a")
    assert served.returncode == 1 and expected in served.stderr, served.stderr
    assert not never.exists(), "serve created its runtime or admin socket directory before the check"
