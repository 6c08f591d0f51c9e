"""The suite runs from the repository root one file at a time, both as `pytest FILE` and `python -m pytest FILE`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# A file that imports the shared fakes (`tests.fakes`): the import that used to fail with
# "No module named 'tests'" under plain `pytest`.
ONE_FILE = "tests/unit/dataplane/test_streams.py"


@pytest.mark.parametrize("runner", ["pytest", "python -m pytest"])
def test_a_single_test_file_runs_from_the_repository_root(runner):
    pytest_script = Path(sys.executable).with_name("pytest")
    if runner == "pytest" and not pytest_script.exists():
        pytest.skip("no pytest console script beside this interpreter")
    argv = [str(pytest_script)] if runner == "pytest" else [sys.executable, "-m", "pytest"]
    result = subprocess.run(
        [*argv, "-q", "-p", "no:cacheprovider", ONE_FILE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert " passed" in result.stdout
