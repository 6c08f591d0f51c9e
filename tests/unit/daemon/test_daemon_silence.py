"""A worker that misses heartbeats, short of its timeout: a silent replica takes no new requests until it beats.

The daemon on a fake launcher (tests/fakes.py) and a gateway that records each announcement of the replicas
that take requests. Pids in start order: front 100, pipeline/0 101, pipeline/1 102.
"""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.lifecycle import DaemonState
from stagevisor.supervisor.daemon.views import group_report, replicated_report
from stagevisor.supervisor.errors import DaemonError
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


def test_a_silent_only_worker_takes_the_daemon_out_of_readiness_while_its_requests_wait_and_status_says_so(tmp_path):
    """
    1. `pipeline`'s only worker misses heartbeats (a frozen process, a blocked event loop; its timeout has not
       passed): the daemon is DEGRADED, so readiness (gRPC health, /ready) says NOT_SERVING and a load balancer
       sends no new requests; status and topology show it READY with its `silent_s`;
    2. admission refuses nothing meanwhile: requests that reach the daemon wait for the worker, and no routing
       changes; watchers get a WARNING saying both;
    3. it beats again: SERVING, `silent_s` null, a NOTICE.
    """

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, AnnouncingGateway
        )
        try:
            readiness: list[bool] = []
            daemon.serving_listeners.append(readiness.append)
            events = daemon.events.subscribe()
            announced = len(daemon.gateway.sets)
            worker = next(w for w in launcher.workers if w.pid == daemon.runners["pipeline"].pid)
            worker.fall_silent()
            await settle(lambda: daemon.state is DaemonState.DEGRADED)
            await settle(lambda: not events.empty())
            status = daemon.status()
            topology = [group_report(g, daemon.runners[g.name], daemon.monitor) for g in daemon.plan.groups]
            admission = daemon.gateway.admission
            refused = admission.down_groups, admission.failed_groups
            warnings = published_warnings(events)
            try:
                await daemon.apply_plan(cpu_plan("front", "pipeline", "pipeline", "pipeline"), dry_run=True)
                refusal = ""
            except DaemonError as error:
                refusal = str(error)
            worker.beat()
            await settle(lambda: daemon.state is DaemonState.SERVING)
            await settle(lambda: not events.empty())
            after = daemon.status()
            return (
                status,
                topology,
                refused,
                warnings,
                list(readiness),  # before the shutdown's NOT_SERVING
                after,
                published_warnings(events, "NOTICE"),
                len(daemon.gateway.sets) - announced,
                refusal,
            )
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    status, topology, refused, warnings, readiness, after, notes, announcements, refusal = asyncio.run(scenario())
    silent = {g.name: (g.state, g.silent_s) for g in status.groups}
    assert silent["front"] == ("READY", None)
    assert silent["pipeline"][0] == "READY" and 0.0 <= silent["pipeline"][1] < 5.0
    assert (status.state, status.workers_ready) == ("DEGRADED", 2)  # its lifecycle state keeps its name
    assert [g.silent_s is not None for g in topology] == [False, True]  # `stagevisor topology`
    assert refused == ((), ())  # requests wait for it rather than fail
    assert warnings == [
        (
            "pipeline",
            "worker pid 101 sent no heartbeat for 3s: its requests wait for it and readiness is NOT_SERVING until it "
            "answers; it is killed if silent for the heartbeat timeout",
        )
    ]
    assert readiness == [False, True]
    assert after.state == "SERVING" and [g.silent_s for g in after.groups] == [None, None]
    assert notes == [("pipeline", "answers its heartbeat again")]
    assert announcements == 0
    # An apply meanwhile is refused naming the silent worker, not an empty list of groups that are down.
    assert "while the daemon is DEGRADED ('pipeline' is silent): wait until" in refusal


def test_readiness_holds_while_one_replica_answers_and_goes_once_every_replica_is_silent(tmp_path):
    async def scenario():
        daemon, workers, _ = await two_replicas(tmp_path)
        try:
            workers["pipeline/1"].fall_silent()
            await settle(lambda: daemon.runners["pipeline/1"].silence != "")
            one = daemon.state, [g.silent_s is not None for g in daemon.status().groups]
            workers["pipeline/0"].fall_silent()
            await settle(lambda: daemon.state is DaemonState.DEGRADED)
            replicas = replicated_report(daemon.plan.groups[1], daemon.replicas, daemon.monitor).workers
            both = [w.silent_s is not None for w in replicas], daemon.gateway.admission.down_groups
            workers["pipeline/1"].beat()
            await settle(lambda: daemon.state is DaemonState.SERVING)
            again = [g.silent_s is not None for g in daemon.status().groups]
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return one, both, again

    one, both, again = asyncio.run(scenario())
    assert one == (DaemonState.SERVING, [False, False, True])
    assert both == ([True, True], ())
    assert again == [False, True, False]
