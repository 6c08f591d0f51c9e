"""A test that hangs fails within its tier's time limit, names itself, and the run goes on (tests/timeouts.py).

Each test here writes a small test file into a `tests/<tier>/` folder under
tmp_path and runs pytest on it in a subprocess with this suite's conftest as a
plugin, as the suite itself would run it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.timeouts import BACKSTOP_S

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 60.0
"""Room for the subprocess's interpreter and pytest to start and collect on a loaded machine."""

PLANTED_UNIT_S = 2.0
"""The unit tier's limit in the planted run: the mechanism is the same at any limit, and waiting out the real
60 s would cost the quick subset a minute (tests/unit/test_timeout_tiers.py checks each tier's own value)."""

HANG_THEN_PASS = f"""
import time

import tests.timeouts

tests.timeouts.UNIT_S = {PLANTED_UNIT_S}  # this run only: the unit tier's limit, shortened (read at collection)

def test_planted_hang():
    time.sleep(3600)

def test_after_the_hang():
    assert True
"""

# SIGALRM blocked: pytest-timeout's signal never arrives, as in a hang inside C code.
UNINTERRUPTIBLE = """
import signal
import time

import pytest

import tests.timeouts

tests.timeouts.BACKSTOP_S = 1.0  # this run only: the backstop's grace, shortened

@pytest.mark.timeout(1)
def test_planted_uninterruptible_hang():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(3600)
"""


def run_planted(tmp_path: Path, tier: str, source: str, limit: float) -> tuple[subprocess.CompletedProcess, float]:
    folder = tmp_path / "tests" / tier
    folder.mkdir(parents=True)
    test_file = folder / "test_planted.py"
    test_file.write_text(source)
    scratch = tmp_path / "tmp"  # a process ended by the backstop leaves its temp directory behind: here
    scratch.mkdir()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--rootdir", str(tmp_path), str(test_file)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=limit + BACKSTOP_S + STARTUP_S,
    )
    return result, time.monotonic() - started


@pytest.mark.slow  # a pytest run that waits out a planted hang
def test_a_planted_hang_in_a_unit_test_fails_that_test_by_name_within_the_unit_limit_and_the_run_goes_on(tmp_path):
    result, took = run_planted(tmp_path, "unit", HANG_THEN_PASS, PLANTED_UNIT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    expected = f"FAILED tests/unit/test_planted.py::test_planted_hang - Failed: Timeout (>{PLANTED_UNIT_S}s)"
    assert expected in output, output
    assert "1 failed, 1 passed" in output, output
    assert PLANTED_UNIT_S <= took < PLANTED_UNIT_S + STARTUP_S, f"the run took {took:.1f} s"


@pytest.mark.slow  # a pytest run that waits out a planted hang and the backstop
def test_a_hang_the_timeout_signal_cannot_reach_ends_the_process_naming_the_test(tmp_path):
    result, took = run_planted(tmp_path, "unit", UNINTERRUPTIBLE, 1.0)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "test_planted.py::test_planted_uninterruptible_hang: still running 1 s past its 1 s timeout" in output
    assert "in test_planted_uninterruptible_hang" in output, output  # the hung thread's stack
    assert took < 2.0 + STARTUP_S, f"the run took {took:.1f} s"
