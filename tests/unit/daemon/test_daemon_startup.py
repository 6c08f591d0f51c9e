"""Daemon startup: an unexpected error in the daemon's own handling of a worker's READY fails startup, logged."""

from __future__ import annotations

import asyncio
import logging

import pytest

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.startup import StartupError, format_startup_failure
from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState
from tests.fakes import FakeLauncher, poll_until
from tests.integration.daemon_helpers import higgs_isolated_audio_encoder
from tests.unit.daemon.daemon_driver import SwitchingGateway


class BrokenReadyHookGateway(SwitchingGateway):
    """A gateway whose READY hook (the text limit a worker declares) fails for the vocoder's group."""

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        if group == "vocoder" and max_text_chars is None:
            raise KeyError("vocoder-limits")


def unstarted(tmp_path, launcher: FakeLauncher, gateway: type) -> Daemon:
    """A daemon of Higgs-TTS (audio encoder isolated: four groups) on `launcher`'s scripted workers, not started."""
    return Daemon(
        higgs_isolated_audio_encoder(),
        DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
        launcher=launcher.factory,
        gateway_factory=gateway,
    )


def test_an_unexpected_error_in_a_ready_hook_fails_startup_naming_the_group_and_is_logged(tmp_path, caplog):
    """
    1. every worker answers its handshake; the daemon's READY hook for the vocoder's group raises KeyError;
    2. startup fails with StartupError naming that group and the exception, instead of serving a worker
       whose exit nothing would notice (the runner watches a worker only after its READY hooks);
    3. the daemon log has the exception with its traceback, and every worker is stopped.
    """
    launcher = FakeLauncher([])

    async def scenario() -> Daemon:
        daemon = unstarted(tmp_path, launcher, BrokenReadyHookGateway)
        with pytest.raises(StartupError) as caught:
            await asyncio.wait_for(daemon.start(), 30)
        error = caught.value
        assert error.failures[0].group == "vocoder"
        assert str(error).startswith("group 'vocoder' failed to start: the daemon failed while taking its worker READY")
        assert "KeyError: 'vocoder-limits'" in format_startup_failure(error)
        return daemon

    with caplog.at_level(logging.ERROR, logger="stagevisor.daemon"):
        daemon = asyncio.run(scenario())
    assert daemon.state is DaemonState.STOPPED
    assert all(daemon.group_state(name) is GroupState.STOPPED for name in daemon.group_names())
    assert all(worker.exitcode() is not None for worker in launcher.workers)
    logged = [r for r in caplog.records if "taking its worker READY" in r.getMessage()]
    assert logged and logged[0].exc_info is not None and logged[0].exc_info[0] is KeyError


def test_requests_are_refused_as_starting_until_every_worker_is_ready(tmp_path):
    """The public servers (and their health checks) start before the workers; a request sent meanwhile is told the
    daemon is starting, with a retry hint, and is admitted once the daemon serves."""
    launcher = FakeLauncher(["ready", "held"])
    seen: list[bool] = []

    async def scenario() -> None:
        daemon = unstarted(tmp_path, launcher, SwitchingGateway)
        starting = asyncio.create_task(daemon.start())
        assert await poll_until(lambda: len(launcher.workers) >= 2)  # the second is held: not READY yet
        seen.append(daemon.gateway.admission.starting)
        launcher.workers[1].answer()
        await asyncio.wait_for(starting, 30)
        seen.append(daemon.gateway.admission.starting)
        await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    assert seen == [True, False]
