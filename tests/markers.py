"""The suite's markers beyond pytest's own: `torch` (needs torch installed) and `slow` (left out of the quick subset).

A test marked `torch` skips where torch is not installed, saying which extra adds it.
CI's second lane installs torch and sets STAGEVISOR_REQUIRE_TORCH=1: there such a
skip is a failure instead, so the torch tests cannot quietly stop running.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_TORCH = "STAGEVISOR_REQUIRE_TORCH"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "torch: needs torch installed (pip install -e '.[torch]'); skipped without it, see tests/markers.py"
    )
    if os.environ.get(REQUIRE_TORCH) == "1" and importlib.util.find_spec("torch") is None:
        raise pytest.UsageError(f"{REQUIRE_TORCH}=1 but torch is not installed in this environment")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("torch") is None or importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get(REQUIRE_TORCH) == "1":
        pytest.fail(f"torch is not installed but {REQUIRE_TORCH}=1 requires the torch tests to run", pytrace=False)
    pytest.skip("needs torch: pip install -e '.[torch]'")
