"""The Ray launcher (supervisor/cluster/launcher.py) joining its cluster: what `serve` is told when it cannot."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.cluster import launcher as ray_launcher
from stagevisor.supervisor.errors import DaemonError, ErrorCode, StagevisorError
from tests.integration.daemon_helpers import make_plan


@pytest.mark.parametrize("code", [ErrorCode.CLUSTER_UNREACHABLE, ErrorCode.CLUSTER_LACKS])
def test_a_coded_refusal_while_joining_keeps_its_code(monkeypatch, code):
    """It became DAEMON_ERROR with the code in its text: `serve` printed `error: DAEMON_ERROR: CLUSTER_LACKS: ...`."""

    def refuse(address):
        raise StagevisorError(code, "the cluster at 10.0.0.1:6379 says no; start it (`ray start --head`)")

    monkeypatch.setattr(ray_launcher, "connect", refuse)
    launcher = ray_launcher.RayLauncher(make_plan("m", [("s", "g", None, None)]), "10.0.0.1:6379")
    with pytest.raises(DaemonError) as raised:
        asyncio.run(launcher.prepare())
    assert raised.value.code is code
    assert raised.value.message == "the cluster at 10.0.0.1:6379 says no; start it (`ray start --head`)"
