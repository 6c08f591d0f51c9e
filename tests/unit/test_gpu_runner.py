"""tests/gpu/run.sh --dry-run shows what it would run on a GPU machine, and runs none of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "run.sh"


def dry_run(*args: str, venv: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "VENV": str(venv)},
    )


def test_the_dry_run_prints_each_command_and_creates_nothing(tmp_path):
    venv = tmp_path / "venv"
    result = dry_run(venv=venv)
    assert result.returncode == 0, result.stderr
    commands = [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]
    assert any("-m venv --system-site-packages" in c for c in commands)
    assert any("pip install" in c and "nvidia-ml-py" in c for c in commands)
    assert any("pytest" in c and "tests/gpu" in c for c in commands)
    assert any("tests/gpu/bench_gpu_vocoder.py" in c for c in commands)
    assert not venv.exists()


def test_a_wheelhouse_makes_pip_install_offline(tmp_path):
    result = dry_run("--wheelhouse", "/wheels", venv=tmp_path / "venv")
    (install,) = [line for line in result.stdout.splitlines() if "pip install" in line and "nvidia-ml-py" in line]
    assert "--no-index --find-links /wheels" in install


def test_an_unknown_option_is_a_usage_error():
    result = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "unknown option --bogus" in result.stderr
