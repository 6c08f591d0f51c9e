"""Per-test time limits by tier: a test that hangs fails on its own, named, within its tier's limit (pytest-timeout).

Every collected test without a `@pytest.mark.timeout(...)` of its own gets one
from its tier: the directory under tests/ it lives in, and the `slow` marker.
The limit covers the test's setup, call and teardown, so a module-scoped
daemon that never comes up fails the first test that asked for it. Each
limit sits above the longest legitimate run of its tier on the shared 2-core
machine under load (load average 40-50): unit tests that run the voice took
up to 30 s there; an integration test may wait up to 300 s for a daemon to
start (daemon_helpers.wait_serving's bound) before it even begins.

pytest-timeout's signal method raises in the main thread, so the test fails
with its name, its fixtures tear down, and the run goes on. A hang the
signal cannot reach (C code that never returns to the interpreter) is caught
by a backstop: BACKSTOP_S after the limit the process prints the test's id
and every thread's stack, and exits (pytest-xdist then reports the crashed
worker with the test it was running, and starts another).

`--timeout N` (or PYTEST_TIMEOUT) on the command line overrides the tiers for
every test; `--timeout 0` turns the limits off, for a debugger.
"""

from __future__ import annotations

import faulthandler
import os
import threading
from collections.abc import Iterable, Iterator

import pytest

UNIT_S = 60.0
"""tests/unit: no processes, no ports; most tests take milliseconds, the voice's up to 30 s under load."""
INTEGRATION_S = 360.0
"""tests/integration (and anything else under tests/): real daemons, whose start counts against the first test."""
SLOW_S = 900.0
"""`@pytest.mark.slow`: several daemons or a Ray cluster in one test."""
GPU_S = 900.0
"""tests/gpu: real models on a CUDA device (tests/gpu/run.sh), loading weights first."""
BACKSTOP_S = 60.0
"""How long past its limit a test that the signal could not interrupt runs before the process exits."""


def tier_timeout(parts: Iterable[str], markers: Iterable[str]) -> float:
    """The limit, in seconds, of a test whose file path has these parts and which carries these markers."""
    names = set(markers)
    if "gpu" in names:
        return GPU_S
    if "slow" in names:
        return SLOW_S
    parts = tuple(parts)
    tiers = {"unit": UNIT_S, "integration": INTEGRATION_S, "gpu": GPU_S}
    for above, below in zip(parts, parts[1:], strict=False):
        if above == "tests" and below in tiers:
            return tiers[below]
    return INTEGRATION_S


def _marker_timeout(item: pytest.Item) -> float | None:
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None
    value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    return float(value) if value is not None else None


class TierTimeouts:
    """The pytest plugin: a timeout marker per test from its tier, and the backstop behind it."""

    def __init__(self, config: pytest.Config) -> None:
        # An explicit limit for every test (command line or environment) wins over the tiers.
        self.overridden = config.getoption("timeout", None) is not None or bool(os.environ.get("PYTEST_TIMEOUT"))
        self.debugging = bool(config.getoption("usepdb", False) or config.getoption("trace", False))
        # The backstop writes to the terminal the run started with: by then fd 2 may be pytest's capture file.
        self.stderr = os.fdopen(os.dup(2), "w", buffering=1)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.overridden:
            return
        for item in items:
            if item.get_closest_marker("timeout") is None:
                limit = tier_timeout(item.path.parts, (m.name for m in item.iter_markers()))
                item.add_marker(pytest.mark.timeout(limit, method="signal"))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        limit = None if self.debugging else _marker_timeout(item)
        if limit is None and self.overridden and not self.debugging:
            limit = item.config.getoption("timeout", None)
        if not limit:
            yield
            return
        backstop = threading.Timer(limit + BACKSTOP_S, self._give_up, (item.nodeid, limit))
        backstop.daemon = True
        backstop.start()
        try:
            yield
        finally:
            backstop.cancel()

    def _give_up(self, nodeid: str, limit: float) -> None:
        self.stderr.write(
            f"\n{nodeid}: still running {BACKSTOP_S:.0f} s past its {limit:.0f} s timeout, which could not "
            "interrupt it (a hang outside Python code); the stacks of every thread follow and the test process "
            "exits\n"
        )
        self.stderr.flush()
        faulthandler.dump_traceback(file=self.stderr, all_threads=True)
        self.stderr.flush()
        os._exit(1)

    def pytest_unconfigure(self) -> None:
        self.stderr.close()
