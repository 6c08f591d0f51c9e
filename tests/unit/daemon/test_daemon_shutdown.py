"""Daemon shutdown always ends with every worker stopped and its sockets removed, whatever fails on the way."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon, DaemonOptions
from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState
from tests.integration.daemon_helpers import higgs_isolated_audio_encoder
from tests.unit.daemon.test_lifecycle_runner import FakeLauncher


class BrokenStopGateway:
    """A gateway whose stop() fails, as remove_leftovers did on a directory planted in /dev/shm."""

    def __init__(self, *args, admission=None) -> None:
        self.stopped = False
        self.admission = admission
        self.shm_dir = ""
        self.metrics = None

    async def start(self) -> None:
        pass

    def stop_accepting(self) -> None:
        pass

    def in_flight(self) -> int:
        return 0

    async def stop(self, grace: float) -> None:
        raise IsADirectoryError(21, "Is a directory", "/dev/shm/stagevisor-0123456789ab-1-zzz")

    def fail_group(self, group: str, reason: str) -> None:
        pass


def test_a_failing_data_plane_stop_still_stops_every_worker_and_removes_the_sockets(tmp_path):
    async def scenario():
        launcher = FakeLauncher([])
        daemon = Daemon(
            higgs_isolated_audio_encoder(),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=launcher.factory,
            gateway_factory=BrokenStopGateway,
        )
        await daemon.start()
        (tmp_path / "d1" / "g0.sock").write_text("")  # stands in for a worker socket
        events = daemon.subscribe()
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return daemon, launcher, events

    daemon, launcher, events = asyncio.run(scenario())
    assert len(launcher.workers) == 4
    assert launcher.prepared and launcher.closed  # the daemon readies its launcher and closes it at shutdown
    assert all(worker.signals == ["TERM"] for worker in launcher.workers)
    assert all(daemon.group_state(name) is GroupState.STOPPED for name in daemon.group_names())
    assert daemon.state is DaemonState.STOPPED
    assert not (tmp_path / "d1").exists()
    drained = []
    while not events.empty():
        drained.append(events.get_nowait())
    assert drained[-1] is None  # WatchEvents streams end


def test_a_group_whose_stop_fails_does_not_keep_the_others_running(tmp_path):
    async def scenario():
        launcher = FakeLauncher([])
        daemon = Daemon(
            higgs_isolated_audio_encoder(),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=launcher.factory,
            gateway_factory=BrokenStopGateway,
        )
        await daemon.start()

        async def broken_stop(reason: str = "") -> None:
            raise RuntimeError("stop failed")

        daemon._runners["tts_frontend"].stop = broken_stop
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return daemon, launcher

    daemon, launcher = asyncio.run(scenario())
    others = [w for w in launcher.workers if w.pid != daemon._runners["tts_frontend"].pid]
    assert len(others) == 3 and all(worker.signals == ["TERM"] for worker in others)
    assert daemon.state is DaemonState.STOPPED and not (tmp_path / "d1").exists()


def test_a_new_watcher_gets_the_recent_history_first_then_what_follows(tmp_path):
    """`stagevisor events` shows how the groups got where they are, not only a header until the next change."""

    async def scenario():
        daemon = Daemon(
            higgs_isolated_audio_encoder(),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=FakeLauncher([]).factory,
            gateway_factory=BrokenStopGateway,
        )
        await daemon.start()
        live_only = daemon.subscribe()
        events = daemon.subscribe(history=True)
        history = [events.get_nowait() for _ in range(events.qsize())]
        assert live_only.empty()  # a watcher that did not ask gets only what follows
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return history, events

    history, events = asyncio.run(scenario())
    started = [(e.group, e.old_state, e.new_state) for e in history]
    assert [group for group, old, new in started if (old, new) == (GroupState.STOPPED, GroupState.STARTING)] == [
        "tts_frontend",
        "audio_encoder",
        "pipeline",
        "vocoder",
    ]
    later = [events.get_nowait() for _ in range(events.qsize())]
    assert later[-1] is None and any(e.new_state is GroupState.STOPPING for e in later[:-1])
