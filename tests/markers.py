"""The suite's markers beyond pytest's own: `torch`, `qwen3` (need those extras), `slow` (not in the quick subset)
and `soak` (not in the default run).

A test marked `torch` skips where torch is not installed, saying which extra adds it.
CI's second lane installs torch and sets STAGEVISOR_REQUIRE_TORCH=1: there such a
skip is a failure instead, so the torch tests cannot quietly stop running.
A test marked `qwen3` needs the `qwen3` extra (qwen-tts, its transformers, torch 2.9.1
and torchaudio) and skips without it; CI's qwen3 lane sets STAGEVISOR_REQUIRE_QWEN3=1.
A test marked `soak` runs minutes of load, kills or restarts by design (each is also `slow`): it skips unless
STAGEVISOR_SOAK=1, which CI's soak lane sets (`STAGEVISOR_SOAK=1 python -m pytest tests -m soak`), so the
whole suite stays a run of minutes.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_TORCH = "STAGEVISOR_REQUIRE_TORCH"
REQUIRE_QWEN3 = "STAGEVISOR_REQUIRE_QWEN3"
RUN_SOAK = "STAGEVISOR_SOAK"
QWEN3_MODULES = ("qwen_tts", "torch", "torchaudio")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "torch: needs torch installed (pip install -e '.[torch]'); skipped without it, see tests/markers.py"
    )
    config.addinivalue_line(
        "markers", "qwen3: needs the qwen3 extra (pip install -e '.[qwen3]'); skipped without it, see tests/markers.py"
    )
    config.addinivalue_line(
        "markers", "worker_torch: the test's daemons may import torch (see tests/integration/conftest.py)"
    )
    config.addinivalue_line(
        "markers", f"soak: minutes of load, kills or restarts by design; skipped unless {RUN_SOAK}=1 (tests/markers.py)"
    )
    if os.environ.get(REQUIRE_TORCH) == "1" and importlib.util.find_spec("torch") is None:
        raise pytest.UsageError(f"{REQUIRE_TORCH}=1 but torch is not installed in this environment")


def _qwen3_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in QWEN3_MODULES)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("soak") is not None and os.environ.get(RUN_SOAK) != "1":
        pytest.skip(
            f"a soak test (minutes of load, kills or restarts by design): {RUN_SOAK}=1 runs it, as CI's soak lane"
        )
    if item.get_closest_marker("qwen3") is not None and not _qwen3_installed():
        if os.environ.get(REQUIRE_QWEN3) == "1":
            pytest.fail(f"the qwen3 extra is not installed but {REQUIRE_QWEN3}=1 requires its tests", pytrace=False)
        pytest.skip("needs the qwen3 extra (qwen-tts, torch 2.9.1, torchaudio): pip install -e '.[qwen3]'")
    if item.get_closest_marker("torch") is None or importlib.util.find_spec("torch") is not None:
        return
    if os.environ.get(REQUIRE_TORCH) == "1":
        pytest.fail(f"torch is not installed but {REQUIRE_TORCH}=1 requires the torch tests to run", pytrace=False)
    pytest.skip("needs torch: pip install -e '.[torch]'")
