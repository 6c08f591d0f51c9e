"""Which time limit each test of the suite gets (tests/timeouts.py)."""

from __future__ import annotations

import os

import pytest

from tests.timeouts import GPU_S, INTEGRATION_S, SLOW_S, UNIT_S, tier_timeout


@pytest.mark.parametrize(
    "path,markers,limit",
    [
        ("/repo/tests/unit/dataplane/test_streams.py", (), UNIT_S),
        ("/repo/tests/integration/test_http_api.py", (), INTEGRATION_S),
        ("/repo/tests/integration/test_ray_launcher.py", ("slow",), SLOW_S),
        ("/repo/tests/unit/dataplane/test_streams.py", ("slow",), SLOW_S),
        ("/repo/tests/gpu/test_gpu_daemon.py", (), GPU_S),
        ("/repo/tests/integration/test_x.py", ("gpu", "slow"), GPU_S),
        ("/repo/tests/test_elsewhere.py", (), INTEGRATION_S),
        ("/home/unit/tests/integration/test_x.py", (), INTEGRATION_S),
        ("/repo/tests/integration/unit/test_x.py", (), INTEGRATION_S),
    ],
)
def test_each_tier_gets_its_limit(path, markers, limit):
    assert tier_timeout(path.split("/"), markers) == limit


def test_the_tiers_grow_from_unit_to_slow():
    assert UNIT_S < INTEGRATION_S < SLOW_S <= GPU_S


def test_every_test_of_this_run_carries_its_tiers_timeout_marker(request):
    marker = request.node.get_closest_marker("timeout")
    if request.config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        pytest.skip("--timeout or PYTEST_TIMEOUT given: it applies to every test instead of the tiers")
    assert marker is not None and marker.args == (UNIT_S,) and marker.kwargs == {"method": "signal"}
