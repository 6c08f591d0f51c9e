"""`stagevisor plan` and `stagevisor models` as processes of their own: what they import, exit codes, a closed pipe.

The same commands' output shapes and error objects are tested in this process in tests/unit/commands/test_cli_plan.py.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_plan_as_a_process_loads_neither_grpc_nor_torch():
    probe = (
        "import sys; from stagevisor.supervisor.cli import main; "
        "code = main(['plan', '--model-path', 'ming-omni-tts', '--isolate-stage', 'vocoder']); "
        "heavy = sorted(m for m in ('grpc', 'torch') if m in sys.modules); "
        "print('HEAVY', heavy); sys.exit(code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_python_m_supervisor_plan_exits_2_on_an_invalid_placement():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "plan",
            "--model-path",
            "moss-tts-local-split",
            "--isolate-stage",
            "vocoder",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: 'tts_engine' -> 'vocoder' cannot cross a process boundary")


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`stagevisor models | head -1`: no BrokenPipeError traceback, the conventional status 141."""
    reader_gone = subprocess.Popen(
        [sys.executable, "-m", "stagevisor", "models"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    reader_gone.stdout.close()
    try:
        _, stderr = reader_gone.communicate(timeout=60)  # reads stderr to its end, bounded
    finally:
        if reader_gone.poll() is None:
            reader_gone.kill()
            reader_gone.communicate(timeout=10)
    assert reader_gone.returncode == 141 and stderr.decode() == ""
