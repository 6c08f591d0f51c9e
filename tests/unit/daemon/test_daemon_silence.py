"""A worker that misses heartbeats, short of its timeout: a silent replica takes no new requests until it beats.

The daemon on a fake launcher (tests/fakes.py) and a gateway that records each announcement of the replicas
that take requests. Pids in start order: front 100, pipeline/0 101, pipeline/1 102.
"""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.placement.planner import rescale
from tests.fakes import FakeWorker, settle
from tests.unit.daemon.daemon_driver import AnnouncingGateway
from tests.unit.daemon.daemon_driver import published_warnings
from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon
from tests.fakes import FakeLauncher


async def two_replicas(tmp_path) -> tuple[Daemon, dict[str, FakeWorker], tuple[str, str]]:
    """A started daemon whose `pipeline` runs two replicas; the workers by name, the replicas' addresses."""
    launcher = FakeLauncher([])
    plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
    daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway)
    by_pid = {worker.pid: worker for worker in launcher.workers}
    workers = {name: by_pid[runner.pid] for name, runner in daemon.runners.items()}
    return daemon, workers, (daemon.runners["pipeline/0"].spec.address, daemon.runners["pipeline/1"].spec.address)


def test_a_silent_replica_leaves_the_rotation_until_it_beats_and_watchers_learn_both(tmp_path):
    """
    1. `pipeline` runs two replicas; pipeline/1 misses heartbeats (its timeout has not passed);
    2. the daemon announces pipeline/0 alone as taking requests, status lists pipeline/1 as missing, and
       watchers get a WARNING naming it and saying no new requests go to it;
    3. it beats again: both take requests, nothing is missing, and watchers get a NOTICE;
    4. it was never signalled: silence alone kills nothing.
    """

    async def scenario():
        daemon, workers, (first, second) = await two_replicas(tmp_path)
        try:
            gateway = daemon.gateway
            events = daemon.events.subscribe()
            silent = workers["pipeline/1"]
            silent.fall_silent()
            await settle(lambda: gateway.sets and gateway.sets[-1] == {first: (first,)})
            missing = daemon.status().missing_replicas
            gauges = {row["name"]: row["silent"] for row in daemon.monitor.group_rows()}
            warnings = published_warnings(events)
            silent.beat()
            await settle(lambda: gateway.sets[-1] == {first: (first, second)})
            after = daemon.status().missing_replicas, published_warnings(events, "NOTICE")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return missing, gauges, warnings, after, silent.signals

    missing, gauges, warnings, (missing_after, notes), signals = asyncio.run(scenario())
    assert missing == ("pipeline/1",)
    assert gauges == {"front": False, "pipeline/0": False, "pipeline/1": True}  # stagevisor_group_silent
    assert warnings == [
        (
            "pipeline/1",
            "worker pid 102 sent no heartbeat for 3s: it takes no new requests (another replica does) until it "
            "answers; it is killed if silent for the heartbeat timeout",
        )
    ]
    assert missing_after == () and notes == [("pipeline/1", "answers its heartbeat again: it takes new requests again")]
    assert signals == ["TERM"]  # the shutdown's, only


def test_when_every_replica_is_silent_they_all_keep_taking_requests_rather_than_none(tmp_path):
    async def scenario():
        daemon, workers, (first, second) = await two_replicas(tmp_path)
        try:
            gateway = daemon.gateway
            workers["pipeline/1"].fall_silent()
            await settle(lambda: gateway.sets and gateway.sets[-1] == {first: (first,)})
            workers["pipeline/0"].fall_silent()
            await settle(lambda: all(daemon.runners[n].silence for n in ("pipeline/0", "pipeline/1")))
            await settle(lambda: gateway.sets[-1] == {first: (first, second)})
            missing = daemon.status().missing_replicas
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return missing

    assert asyncio.run(scenario()) == ()  # both take requests: status lists neither as taking none


def test_a_silent_worker_of_a_group_without_replicas_is_a_warning_and_changes_no_routing(tmp_path):
    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, AnnouncingGateway
        )
        try:
            events = daemon.events.subscribe()
            announced = len(daemon.gateway.sets)
            worker = next(w for w in launcher.workers if w.pid == daemon.runners["pipeline"].pid)
            worker.fall_silent()
            await settle(lambda: daemon.runners["pipeline"].silence != "")
            await settle(lambda: not events.empty())
            warnings = published_warnings(events)
            worker.beat()
            await settle(lambda: daemon.runners["pipeline"].silence == "")
            await settle(lambda: not events.empty())
            return warnings, published_warnings(events, "NOTICE"), len(daemon.gateway.sets) - announced
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    warnings, notes, announcements = asyncio.run(scenario())
    assert warnings == [
        (
            "pipeline",
            "worker pid 101 sent no heartbeat for 3s: its requests wait for it until it answers; "
            "it is killed if silent for the heartbeat timeout",
        )
    ]
    assert notes == [("pipeline", "answers its heartbeat again")]
    assert announcements == 0
