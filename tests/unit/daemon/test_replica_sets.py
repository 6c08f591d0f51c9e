"""The daemon's replica sets (daemon/replicas.py) with fakes: drain order, availability, rolling restarts, scaling.

Real runners on a fake launcher, a fake gateway that records every
announcement, acknowledgement wait and in-flight read in order
(tests/fakes.py: FakeReplicaHost, FakeReplicaGateway). Pids come from the
fake launcher in start order: pipeline 100, vocoder/0 101, vocoder/1 102.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from stagevisor.supervisor.daemon import replicas as replicas_module
from stagevisor.supervisor.daemon.lifecycle import GroupState
from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.daemon.replicas import ACK_TIMEOUT
from stagevisor.supervisor.plan import Edge, Plan, PlannedStage, ProcessGroup
from tests.fakes import FakeLauncher, FakeReplicaHost, poll_until, settle

S = GroupState


def plan(replicas: int = 2) -> Plan:
    stages = (
        PlannedStage("pre", "pipeline", None, 1, None, None, "m:f", next=("voc",)),
        PlannedStage("voc", "vocoder", 0, 1, 0.1, "declared", "m:f"),
    )
    groups = (
        ProcessGroup("pipeline", ("pre",), None, None),
        ProcessGroup(
            "vocoder", ("voc",), 0, 0.1, replicas=replicas, replica_gpus=(0,) * replicas if replicas > 1 else ()
        ),
    )
    return Plan("m", "org/m", False, stages, groups, (Edge("pre", "voc", "next", True, True),), ())


def run(scenario) -> None:
    asyncio.run(scenario())


async def started(replicas: int = 2, **options) -> FakeReplicaHost:
    host = FakeReplicaHost(plan(replicas), **options)
    await host.start()
    host.gateway.calls.clear()
    return host


def in_flight_reads(host: FakeReplicaHost) -> int:
    return sum(1 for call in host.gateway.calls if call[0] == "in_flight")


# ---- draining ---------------------------------------------------------------------


def test_a_drain_stops_routing_then_waits_for_the_acknowledgement_then_for_in_flight_then_stops_the_worker():
    """
    1. restarting vocoder/1 first announces the set without it (vocoder/0 alone takes requests);
    2. until the workers acknowledge that announcement, nothing reads in-flight and the worker runs on;
    3. after it, the drain waits while the gateway still has requests on vocoder/1;
    4. once those end, the worker gets SIGTERM, its replacement comes up and is announced again.
    """

    async def scenario():
        host = await started()
        gateway, worker = host.gateway, host.launcher.workers[2]
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        gateway.acks.clear()
        gateway.in_flight[v1] = 2
        restarting = asyncio.create_task(host.replicas.restart_replica("vocoder/1"))

        await settle(lambda: gateway.kinds() == ["push", "wait"])
        assert gateway.pushes() == [({v0: (v0,)}, ())]
        assert host.replicas.missing() == ["vocoder/1"] and host.runner("vocoder/1").state is S.READY
        for _ in range(100):  # the drain gets every chance to move on (loop turns, not wall time)
            await asyncio.sleep(0)
        assert gateway.kinds() == ["push", "wait"] and worker.signals == []

        gateway.acks.set()
        assert await poll_until(lambda: in_flight_reads(host) >= 3, timeout=10)
        assert worker.signals == [] and not restarting.done()
        assert {call[1] for call in gateway.calls if call[0] == "in_flight"} == {v1}  # only the drained replica

        gateway.in_flight[v1] = 0
        old, new = await asyncio.wait_for(restarting, 10)
        assert (old, new) == (102, 103) and worker.signals == ["TERM"]
        assert gateway.kinds()[:4] == ["push", "wait", "acked", "in_flight"]
        assert gateway.pushes()[-1] == ({v0: (v0, v1)}, ())
        assert host.replicas.draining == set() and host.replicas.missing() == []
        await host.stop()

    run(scenario)


def test_the_drain_waits_for_the_announcement_it_made_and_for_the_workers_ready_before_it():
    async def scenario():
        host = await started()
        await host.replicas.drain(host.runner("vocoder/1"))
        push, wait = host.gateway.calls[0], host.gateway.calls[1]
        assert push[0] == "push" and wait == ("wait", push[1], ACK_TIMEOUT)
        await host.stop()

    run(scenario)


def test_workers_that_never_acknowledge_are_named_and_the_drain_goes_on(caplog):
    async def scenario():
        host = await started()
        host.gateway.unacknowledged = ["pipeline"]
        with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
            await asyncio.wait_for(host.replicas.restart_replica("vocoder/1"), 10)
        assert host.runner("vocoder/1").state is S.READY
        await host.stop()

    run(scenario)
    assert any(
        "pipeline" in r.getMessage() and "did not confirm the replica change" in r.getMessage() for r in caplog.records
    )


def test_a_drain_waits_for_in_flight_requests_no_longer_than_the_drain_timeout():
    async def scenario():
        host = await started(drain_timeout=0.2)
        worker = host.launcher.workers[2]
        host.gateway.in_flight[host.address("vocoder/1")] = 1  # never ends
        await asyncio.wait_for(host.replicas.restart_replica("vocoder/1"), 10)
        assert worker.signals == ["TERM"] and host.runner("vocoder/1").state is S.READY
        assert in_flight_reads(host) >= 2  # it did wait, polling
        await host.stop()

    run(scenario)


def test_a_replica_that_is_not_ready_is_restarted_without_a_drain():
    async def scenario():
        host = await started(launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        runner = host.runner("vocoder/1")
        host.launcher.workers[2].exit(-9)  # its replacement hangs in STARTING
        await settle(lambda: runner.state is S.STARTING)
        host.gateway.calls.clear()
        await asyncio.wait_for(host.replicas.restart_replica("vocoder/1"), 10)
        assert runner.state is S.READY
        assert "wait" not in host.gateway.kinds() and "in_flight" not in host.gateway.kinds()
        await host.stop()

    run(scenario)


# ---- availability pushes ---------------------------------------------------------------


def test_a_replica_that_dies_is_announced_lost_then_out_of_rotation_then_back_when_ready():
    async def scenario():
        host = await started()
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        host.launcher.workers[2].exit(-9)
        await settle(lambda: host.runner("vocoder/1").state is S.READY and host.runner("vocoder/1").pid == 103)
        assert host.gateway.pushes() == [
            ({v0: (v0, v1)}, (v1,)),  # its requests fail now, wherever they were sent
            ({v0: (v0,)}, ()),  # READY -> BACKOFF
            ({v0: (v0, v1)}, ()),  # STARTING -> READY; BACKOFF -> STARTING changed nothing
        ]
        await host.stop()

    run(scenario)


def test_every_change_into_or_out_of_ready_is_announced_and_no_other():
    async def scenario():
        host = await started()
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        await host.runner("vocoder/0").stop("test")  # READY -> STOPPING -> STOPPED
        assert host.gateway.pushes() == [({v0: (v1,)}, ())]
        host.runner("vocoder/0").spawn()  # STOPPED -> STARTING
        assert len(host.gateway.pushes()) == 1
        await host.runner("vocoder/0").await_ready()  # STARTING -> READY
        assert host.gateway.pushes() == [({v0: (v1,)}, ()), ({v0: (v0, v1)}, ())]
        await host.stop()

    run(scenario)


def test_a_restarted_worker_of_an_unreplicated_group_is_told_the_current_replicas():
    async def scenario():
        host = await started()
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        host.launcher.workers[0].exit(-9)  # the pipeline's worker
        await settle(lambda: host.runner("pipeline").state is S.READY and host.runner("pipeline").pid == 103)
        assert host.gateway.pushes() == [({v0: (v0, v1)}, ())]  # once, when it is READY again; nothing lost
        await host.stop()

    run(scenario)


def test_without_replicated_groups_nothing_is_announced():
    async def scenario():
        host = await started(replicas=1)
        assert host.replicas.push() == 0
        host.launcher.workers[1].exit(-9)
        await settle(lambda: host.runner("vocoder").state is S.READY and host.runner("vocoder").pid == 102)
        assert host.gateway.calls == []
        await host.stop()

    run(scenario)


def test_only_ready_workers_are_sent_the_announcement():
    async def scenario():
        host = await started()
        await host.runner("pipeline").stop("test")
        host.replicas.push()
        assert host.gateway.told[-1] == {n: host.address(n) for n in ("vocoder/0", "vocoder/1")}
        await host.stop()

    run(scenario)


# ---- states -------------------------------------------------------------------------


def test_a_group_is_ready_when_every_replica_is_and_missing_lists_the_others():
    async def scenario():
        host = await started(launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        assert host.replicas.group_state("vocoder") is S.READY and host.replicas.missing() == []
        host.launcher.workers[2].exit(-9)
        await settle(lambda: host.runner("vocoder/1").state is S.STARTING)
        assert host.replicas.group_state("vocoder") is S.STARTING
        assert host.replicas.group_state("pipeline") is S.READY
        assert host.replicas.missing() == ["vocoder/1"]  # a replica, never an unreplicated group
        assert [r.name for r in host.replicas.runners_of("vocoder")] == ["vocoder/0", "vocoder/1"]
        with pytest.raises(KeyError):
            host.replicas.group_state("nope")
        await host.stop()

    run(scenario)


def test_replicas_a_scale_down_drains_take_requests_while_the_replica_it_keeps_is_down():
    """Before: `scale vocoder=1` drained vocoder/1 while vocoder/0 was killed, and with no replica taking requests
    every request failed UNAVAILABLE until vocoder/0 had restarted, though vocoder/1 was READY."""

    async def scenario():
        host = await started(launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        host.replicas.draining.add("vocoder/1")  # a scale down to one has taken it out of rotation
        host.launcher.workers[1].exit(-9)  # vocoder/0, the replica the scale keeps
        await settle(lambda: host.runner("vocoder/0").state is S.STARTING)
        sets, lost = host.gateway.pushes()[-1]
        assert sets == {v0: (v1,)} and host.replicas.missing() == ["vocoder/0"]
        host.replicas.draining.discard("vocoder/1")
        await host.stop()

    run(scenario)


# ---- rolling restarts ----------------------------------------------------------------


def test_a_rolling_restart_replaces_one_replica_at_a_time_and_always_leaves_one_taking_requests():
    async def scenario():
        host = await started()
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        first_old, last_new = await asyncio.wait_for(host.replicas.restart_group("vocoder"), 10)
        assert (first_old, last_new) == (101, 104)
        assert [sets for sets, _ in host.gateway.pushes()] == [
            {v0: (v1,)},  # vocoder/0 drained
            {v0: (v1,)},  # vocoder/0 stopping
            {v0: (v0, v1)},  # vocoder/0 READY again
            {v0: (v0,)},  # only then vocoder/1 drained
            {v0: (v0,)},
            {v0: (v0, v1)},
        ]
        assert [r.pid for r in host.replicas.runners_of("vocoder")] == [103, 104]
        await host.stop()

    run(scenario)


# ---- scaling ------------------------------------------------------------------------


def test_scaling_one_worker_to_two_renames_it_replica_0_and_announces_both_once_ready():
    async def scenario():
        host = await started(replicas=1)
        old, new, names = await asyncio.wait_for(host.replicas.scale("vocoder", 2), 10)
        assert (old, new, names) == (1, 2, ["vocoder/0", "vocoder/1"])
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        assert host.runner("vocoder/0").pid == 101  # the same worker, renamed
        assert host.gateway.pushes()[-1] == ({v0: (v0, v1)}, ())
        assert host.plan.group("vocoder").replicas == 2 and list(host.runners) == ["pipeline", *names]
        await host.stop()

    run(scenario)


def test_a_scale_tells_each_worker_it_renamed_its_name_now():
    """After `scale vocoder=1` from 3 the worker kept calling itself `vocoder/0` (its process title `sv:vocoder/0`,
    its log lines `[vocoder/0 pid N]`) while status and topology named it `vocoder`: nothing told it. The announcement
    after a scale carries every READY worker's name now, by the name it started under."""

    async def scenario():
        host = await started(replicas=3)
        await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        assert host.gateway.names[-1] == {"pipeline": "pipeline", "vocoder/0": "vocoder"}
        await asyncio.wait_for(host.replicas.scale("vocoder", 2), 10)
        assert host.gateway.names[-1]["vocoder/0"] == "vocoder/0"  # back to its first name
        await host.stop()

    run(scenario)


def test_scaling_down_drains_the_highest_replicas_first_each_before_it_stops():
    async def scenario():
        host = await started(replicas=3)
        v0, v1 = host.address("vocoder/0"), host.address("vocoder/1")
        w1, w2 = host.launcher.workers[2], host.launcher.workers[3]
        old, new, names = await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        assert (old, new, names) == (3, 1, ["vocoder"])
        drained = [sets[v0] for sets, _ in host.gateway.pushes()]
        assert drained[0] == (v0, v1)  # vocoder/2 out first
        assert (v0,) in drained[1:] and drained.index((v0,)) > 0
        assert w1.signals == ["TERM"] and w2.signals == ["TERM"]
        assert list(host.runners) == ["pipeline", "vocoder"] and host.runner("vocoder").pid == 101
        assert host.replicas.draining == set()
        await host.stop()

    run(scenario)


def test_a_replica_that_fails_to_start_undoes_the_scale():
    async def scenario():
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "fail"]))
        with pytest.raises(WorkerStartError):
            await asyncio.wait_for(host.replicas.scale("vocoder", 2), 10)
        assert list(host.runners) == ["pipeline", "vocoder"] and host.runner("vocoder").pid == 101
        assert host.plan.group("vocoder").replicas == 1 and host.adopted == []
        await host.stop()

    run(scenario)


@pytest.mark.parametrize("replicas", [1, 2])
def test_scaling_to_the_count_already_running_changes_no_worker_and_no_name(replicas):
    async def scenario():
        host = await started(replicas=replicas)
        names = list(host.runners)
        old, new, listed = await asyncio.wait_for(host.replicas.scale("vocoder", replicas), 10)
        assert (old, new) == (replicas, replicas) and list(host.runners) == names
        assert listed == [n for n in names if n.startswith("vocoder")]
        assert all(w.signals == [] for w in host.launcher.workers) and len(host.launcher.workers) == 1 + replicas
        await host.stop()

    run(scenario)


def test_scaling_down_drains_each_removed_replica_before_it_is_stopped():
    async def scenario():
        host = await started(replicas=3)
        v1, v2 = host.address("vocoder/1"), host.address("vocoder/2")
        await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        kinds = host.gateway.kinds()
        assert kinds.count("wait") == 2  # one acknowledged announcement per removed replica
        reads = [call[1] for call in host.gateway.calls if call[0] == "in_flight"]
        assert reads == [v2, v1]  # each drained in turn, the highest first
        await host.stop()

    run(scenario)


def test_a_replica_not_ready_is_stopped_without_a_drain_when_scaling_down():
    async def scenario():
        host = await started(replicas=3, launcher=FakeLauncher(["ready"] * 4 + ["hang"]))
        host.launcher.workers[3].exit(-9)  # vocoder/2's replacement hangs in STARTING
        await settle(lambda: host.runner("vocoder/2").state is S.STARTING)
        host.gateway.calls.clear()
        await asyncio.wait_for(host.replicas.scale("vocoder", 2), 10)
        assert "wait" not in host.gateway.kinds() and "in_flight" not in host.gateway.kinds()
        assert list(host.runners) == ["pipeline", "vocoder/0", "vocoder/1"]
        await host.stop()

    run(scenario)


def test_a_rolling_restart_of_a_group_without_workers_restarts_nothing():
    async def scenario():
        host = await started()
        assert await host.replicas.restart_group("nope") == (0, 0)
        assert len(host.launcher.workers) == 3
        await host.stop()

    run(scenario)


def test_a_failed_scale_is_undone_even_when_stopping_a_new_replica_fails(monkeypatch):
    async def scenario():
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "ready", "fail"]))
        add_runner = host.add_runner

        def add_failing_stop(spec):
            runner = add_runner(spec)
            if spec.name == "vocoder/1":

                async def stop(reason="x"):
                    raise RuntimeError("stop failed")

                runner.stop = stop
            return runner

        monkeypatch.setattr(host, "add_runner", add_failing_stop)
        with pytest.raises(WorkerStartError):  # vocoder/2 failed to start; vocoder/1's failed stop does not hide it
            await asyncio.wait_for(host.replicas.scale("vocoder", 3), 10)
        assert list(host.runners) == ["pipeline", "vocoder"] and host.adopted == []
        await host.stop()

    run(scenario)


def test_the_replica_drain_lasts_as_long_as_a_request_may_run_and_at_least_the_drain_timeout():
    """Before: a replica was stopped after --drain-timeout while its requests could run to --request-timeout."""
    slack = replicas_module.REPLICA_DRAIN_SLACK
    assert replicas_module.replica_drain_timeout(30.0, 300.0) == 300.0 + slack
    assert replicas_module.replica_drain_timeout(600.0, 300.0) == 600.0


def test_the_replica_drain_is_the_request_timeout_plus_the_documented_five_seconds():
    assert replicas_module.replica_drain_timeout(30.0, 300.0) == 305.0
    assert replicas_module.replica_drain_timeout(305.0, 300.0) == 305.0
    assert replicas_module.replica_drain_timeout(306.0, 300.0) == 306.0


# ---- what the tests above leave open -----------------------------------------------------


def test_a_replica_whose_replacement_fails_to_start_is_no_longer_counted_as_draining():
    async def scenario():
        # vocoder/1's replacement fails, and the retry in the background hangs in STARTING
        host = await started(launcher=FakeLauncher(["ready", "ready", "ready", "fail", "hang"]))
        with pytest.raises(WorkerStartError):
            await host.replicas.restart_replica("vocoder/1")
        draining = set(host.replicas.draining)
        await host.stop()
        return draining

    assert asyncio.run(scenario()) == set()


def test_a_scale_waits_for_a_rolling_restart_of_the_group_to_end_before_it_starts():
    async def scenario():
        host = await started()
        host.gateway.acks.clear()  # the rolling restart holds at its first drain
        restarting = asyncio.create_task(host.replicas.restart_group("vocoder"))
        await settle(lambda: "wait" in host.gateway.kinds())
        scaling = asyncio.create_task(host.replicas.scale("vocoder", 3))
        for _ in range(100):  # loop turns, not wall time
            await asyncio.sleep(0)
        spawned_meanwhile = len(host.launcher.workers)
        host.gateway.acks.set()
        await asyncio.wait_for(asyncio.gather(restarting, scaling), 10)
        pids = [r.pid for r in host.replicas.runners_of("vocoder")]
        await host.stop()
        return spawned_meanwhile, pids

    spawned_meanwhile, pids = asyncio.run(scenario())
    assert spawned_meanwhile == 3  # no new replica while the restart runs
    assert pids == [103, 104, 105]  # both replaced first, then the third added


def test_scaling_down_to_one_announces_the_single_worker_under_its_own_name_last():
    async def scenario():
        host = await started(replicas=2)
        await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        single = host.address("vocoder")
        pushes = host.gateway.pushes()
        await host.stop()
        return single, pushes

    single, pushes = asyncio.run(scenario())
    assert pushes[-1] == ({single: (single,)}, ())


def test_a_failed_scale_stops_the_new_replicas_that_did_start():
    async def scenario():
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "ready", "fail"]))
        with pytest.raises(WorkerStartError):
            await asyncio.wait_for(host.replicas.scale("vocoder", 3), 10)
        signals = [list(w.signals) for w in host.launcher.workers]
        await host.stop()
        return signals

    signals = asyncio.run(scenario())
    assert signals[2] == ["TERM"]  # vocoder/1 was READY: stopped, not left running outside the plan
    assert signals[0] == [] and signals[1] == []


def test_a_replica_removed_by_a_scale_down_is_stopped_while_still_known_so_its_leaving_is_announced():
    async def scenario():
        host = await started(replicas=2)
        v0 = host.address("vocoder/0")
        await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        pushes = host.gateway.pushes()
        await host.stop()
        return v0, pushes

    v0, pushes = asyncio.run(scenario())
    # the drain's announcement, then one as vocoder/1 leaves READY, then the single worker's
    assert [sets for sets, _ in pushes[:2]] == [{v0: (v0,)}, {v0: (v0,)}]
    assert len(pushes) == 3


def test_the_lifecycle_of_replicas_added_or_removed_by_a_scale_names_the_scale():
    async def scenario():
        host = await started(replicas=1)
        await asyncio.wait_for(host.replicas.scale("vocoder", 2), 10)
        await asyncio.wait_for(host.replicas.scale("vocoder", 1), 10)
        events = [(e.group, e.new_state, e.reason) for e in host.events]
        await host.stop()
        return events

    events = asyncio.run(scenario())
    assert ("vocoder/1", S.STARTING, "scale vocoder to 2") in events
    assert ("vocoder/1", S.STOPPING, "scale vocoder to 1") in events


def test_a_drain_waits_for_in_flight_requests_up_to_the_host_s_drain_timeout_not_the_ack_timeout(monkeypatch):
    now = [0.0]

    def monotonic() -> float:
        now[0] += 1.0  # every read of the clock is a second later
        return now[0]

    monkeypatch.setattr(replicas_module, "time", type("Clock", (), {"monotonic": staticmethod(monotonic)}))

    async def scenario():
        host = await started(drain_timeout=3 * ACK_TIMEOUT)
        host.gateway.in_flight[host.address("vocoder/1")] = 1  # never ends
        await asyncio.wait_for(host.replicas.drain(host.runner("vocoder/1")), 10)
        reads = in_flight_reads(host)
        await host.stop()
        return reads

    reads = asyncio.run(scenario())
    assert 2 * ACK_TIMEOUT < reads <= 3 * ACK_TIMEOUT + 1


def test_a_scale_fails_when_any_new_replica_fails_to_start_not_only_the_last():
    async def scenario():
        # pipeline, vocoder, then vocoder/1 fails while vocoder/2 comes up
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "fail", "ready"]))
        with pytest.raises(WorkerStartError):
            await asyncio.wait_for(host.replicas.scale("vocoder", 3), 10)
        names, adopted = list(host.runners), list(host.adopted)
        await host.stop()
        return names, adopted

    names, adopted = asyncio.run(scenario())
    assert names == ["pipeline", "vocoder"] and adopted == []


def test_announcing_waits_for_the_workers_acknowledgement():
    async def scenario():
        host = await started()
        host.gateway.acks.clear()
        announcing = asyncio.create_task(host.replicas.announce())
        await settle(lambda: "wait" in host.gateway.kinds())
        for _ in range(20):
            await asyncio.sleep(0)
        waited = not announcing.done()
        host.gateway.acks.set()
        await asyncio.wait_for(announcing, 10)
        kinds = host.gateway.kinds()
        await host.stop()
        return waited, kinds

    waited, kinds = asyncio.run(scenario())
    assert waited and kinds[:3] == ["push", "wait", "acked"]


def test_a_worker_that_is_not_a_replica_is_never_listed_missing():
    async def scenario():
        host = await started(launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        host.launcher.workers[0].exit(-9)  # the pipeline's single worker: its replacement hangs in STARTING
        await settle(lambda: host.runner("pipeline").state is S.STARTING)
        missing = host.replicas.missing()
        await host.stop()
        return missing

    assert asyncio.run(scenario()) == []


def test_workers_that_do_not_acknowledge_are_waited_for_five_seconds(caplog):
    async def scenario():
        host = await started()
        host.gateway.unacknowledged = ["pipeline"]
        with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
            await host.replicas.announce()
        waits = [call[2] for call in host.gateway.calls if call[0] == "wait"]
        await host.stop()
        return waits

    assert asyncio.run(scenario()) == [5.0]
    assert any("did not confirm the replica change within 5s" in r.getMessage() for r in caplog.records)


def test_a_scale_down_stops_a_replica_only_once_its_requests_have_ended():
    async def scenario():
        host = await started(replicas=2)
        worker, v1 = host.launcher.workers[2], host.address("vocoder/1")
        host.gateway.in_flight[v1] = 1
        scaling = asyncio.create_task(host.replicas.scale("vocoder", 1))
        assert await poll_until(lambda: in_flight_reads(host) >= 3, timeout=10)
        signalled_while_busy = list(worker.signals)
        host.gateway.in_flight[v1] = 0
        await asyncio.wait_for(scaling, 10)
        signals = list(worker.signals)
        await host.stop()
        return signalled_while_busy, signals

    signalled_while_busy, signals = asyncio.run(scenario())
    assert signalled_while_busy == [] and signals == ["TERM"]


def test_a_group_is_found_by_its_exact_name_not_by_a_prefix_of_it():
    async def scenario():
        host = await started()
        found = tuple([r.name for r in host.replicas.runners_of(name)] for name in ("vocode", "vocoder"))
        with pytest.raises(KeyError):
            host.replicas.group_state("vocode")
        await host.stop()
        return found

    assert asyncio.run(scenario()) == ([], ["vocoder/0", "vocoder/1"])


def test_each_announcement_goes_to_every_ready_worker_and_only_to_them():
    async def scenario():
        host = await started()
        await host.runner("pipeline").stop("test")
        host.gateway.told.clear()
        host.replicas.push()
        expected = {n: host.address(n) for n in ("vocoder/0", "vocoder/1")}
        await host.stop()
        return host.gateway.told[0], expected

    told, expected = asyncio.run(scenario())
    assert told == expected


def test_a_replica_restart_that_waited_for_a_scale_down_removing_it_starts_no_worker():
    """
    1. a scale-down from 3 to 2 holds at the drain of vocoder/2;
    2. meanwhile an operator restarts vocoder/2 (`stagevisor restart vocoder/2`);
    3. the scale removes vocoder/2: the restart finds it gone (KeyError, as for an
       unknown name) instead of starting a worker nothing supervises any more.
    """

    async def scenario():
        host = await started(replicas=3)
        host.gateway.acks.clear()  # the scale-down holds at its drain of vocoder/2
        scaling = asyncio.create_task(host.replicas.scale("vocoder", 2))
        await settle(lambda: "wait" in host.gateway.kinds())
        restarting = asyncio.create_task(host.replicas.restart_replica("vocoder/2"))
        for _ in range(100):  # loop turns, not wall time
            await asyncio.sleep(0)
        host.gateway.acks.set()
        results = await asyncio.wait_for(asyncio.gather(scaling, restarting, return_exceptions=True), 10)
        supervised = {r.pid for r in host.runners.values()}
        running = {w.pid for w in host.launcher.workers if not w.exited.done()}
        await host.stop()
        return results, supervised, running

    (scaled, restarted), supervised, running = asyncio.run(scenario())
    assert scaled == (3, 2, ["vocoder/0", "vocoder/1"])
    assert isinstance(restarted, KeyError)
    assert running == supervised  # no worker left running outside the daemon's runners


@pytest.mark.parametrize(("first", "scales"), [(1, (2,)), (2, (1,))])
def test_announcements_await_each_worker_under_the_name_it_answers_with_after_a_scale_renamed_it(first, scales):
    """A worker answers a Replicas frame with the name it was started under: scaling 1 -> 2 renames the
    running `vocoder` to `vocoder/0` (and 2 -> 1 back) without restarting it, so the announcement after a
    scale must await it as `vocoder`; awaited as `vocoder/0` it never answers and every drain waits ACK_TIMEOUT."""

    async def scenario():
        host = await started(replicas=first)
        for count in scales:
            await asyncio.wait_for(host.replicas.scale("vocoder", count), 10)
        host.replicas.push()
        awaited = host.gateway.told[-1]
        running = {w.pid for w in host.launcher.workers if not w.exited.done()}
        await host.stop()
        return awaited, {host.launcher.names[pid] for pid in running}

    awaited, answering = asyncio.run(scenario())
    assert set(awaited) == answering


def test_a_replica_killed_while_a_scale_down_stops_it_is_announced_lost_so_senders_fail_what_it_held():
    """
    1. a scale-down drains vocoder/2 and sends it SIGTERM;
    2. it never exits (SIGSTOPped: it stops beating too) and is killed;
    3. its address is announced lost: workers that routed requests to it fail them now, instead of the
       client waiting until its deadline for audio the killed replica will never send.
    """

    async def scenario():
        host = await started(replicas=3, launcher=FakeLauncher(["ready", "ready", "ready", "ignore-term"]))
        v2, w2 = host.address("vocoder/2"), host.launcher.workers[3]
        scaling = asyncio.create_task(host.replicas.scale("vocoder", 2))
        await settle(lambda: w2.signals == ["TERM"])
        w2.wedge()
        await asyncio.wait_for(scaling, 10)
        await host.stop()
        return v2, w2, host.gateway.pushes()

    v2, w2, pushes = asyncio.run(scenario())
    assert w2.signals == ["TERM", "KILL"]
    assert any(lost == (v2,) for _, lost in pushes)


# ---- a single worker's restart without a pause --------------------------------------------


def test_a_single_workers_restart_starts_the_new_one_beside_switches_then_waits_for_the_old_ones_requests():
    """
    1. the group is announced at its address with the old worker alone (senders pin what it holds);
    2. the new worker starts at the alternate address; once READY the group's address maps to it;
    3. the old worker gets no SIGTERM while a request in flight at the switch runs; then it does;
    4. the reply is (old pid, new pid), the new runner is the group's with the restart counted.
    """

    async def scenario():
        host = await started(replicas=1)
        gateway, old = host.gateway, host.launcher.workers[1]
        address = host.address("vocoder")
        gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))

        await poll_until(lambda: len(host.launcher.workers) == 3 and len(gateway.pushes()) >= 2)
        new_address = host.address("vocoder")
        assert new_address.endswith("/g1.alt.sock") and address.endswith("/g1.sock")
        assert gateway.pushes()[0] == ({address: (address,)}, ())
        assert gateway.pushes()[-1] == ({address: (new_address,)}, ())
        await asyncio.sleep(0.1)
        assert old.signals == [] and not restarting.done()
        gateway.requests = {"b"}  # a request that came after the switch does not hold the old worker
        assert await asyncio.wait_for(restarting, 5) == (101, 102)
        assert old.signals == ["TERM"]
        runner = host.runner("vocoder")
        assert (runner.pid, runner.state, runner.restarts) == (102, S.READY, 1)
        assert [outcome for _, outcome in host.retired] == ["restarted without a pause: pid 101 -> 102"]
        await host.stop()

    run(scenario)


def test_the_next_restart_without_a_pause_moves_the_worker_back_to_the_groups_address():
    async def scenario():
        host = await started(replicas=1)
        address = host.address("vocoder")
        await host.replicas.replace_worker("vocoder")
        assert await host.replicas.replace_worker("vocoder") == (102, 103)
        assert host.address("vocoder") == address
        assert host.gateway.pushes()[-1] == ({address: (address,)}, ())
        assert host.runner("vocoder").restarts == 2
        await host.stop()

    run(scenario)


def test_a_new_worker_that_fails_to_start_leaves_the_old_one_serving_and_says_so():
    async def scenario():
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "fail"]))
        old = host.launcher.workers[1]
        failed = r"did not start beside pid 101: stage 'x' failed to build: boom"
        with pytest.raises(WorkerStartError, match=failed) as e:
            await host.replicas.replace_worker("vocoder")
        assert e.value.advice == "pid 101 serves on unchanged"  # INTERNAL for the operator, not a refusal
        assert (e.value.stage, e.value.traceback) == ("x", "Traceback ...")  # the stage that failed, and why
        assert old.signals == [] and host.runner("vocoder").pid == 101
        assert host.runner("vocoder").state is S.READY
        address = host.address("vocoder")
        assert host.gateway.pushes()[-1] == ({address: (address,)}, ())
        assert host.retired[0][1].endswith("pid 101 serves on")
        assert host.warned == [host.retired[0][1]]  # a WARNING for watchers, not a NOTICE
        await host.stop()

    run(scenario)


@pytest.mark.parametrize("restarts_before", [0, 1], ids=["old-at-the-groups-address", "old-at-its-other-address"])
def test_a_new_worker_that_dies_while_the_old_one_drains_gives_the_groups_requests_back_to_the_old_one(
    restarts_before,
):
    """
    1. a restart without a pause switched `vocoder` to its new worker; the old one holds request "a";
    2. the new worker dies: its address is announced lost, then the old one's as the group's set (not an empty
       set, which sends every request to the group's address: the dead worker's or the old one's, by parity);
    3. "a" ends, "b" came while the old worker took the group's requests: the old one is not stopped;
    4. the crash recovery's worker is READY: the group's address maps to it again; the old one still waits for
       "b", and stops once it ended. The reply names the worker READY now.
    """

    async def scenario():
        outcomes = ["ready", "ready"] + ["ready"] * restarts_before + ["ready", "held"]
        host = await started(replicas=1, launcher=FakeLauncher(outcomes))
        for _ in range(restarts_before):
            await asyncio.wait_for(host.replicas.replace_worker("vocoder"), 5)
        gateway, workers = host.gateway, host.launcher.workers
        group = host.address("vocoder") if restarts_before == 0 else host.runner("pipeline").spec.routes["voc"]
        old_address, old_pid = host.address("vocoder"), host.runner("vocoder").pid
        old = workers[-1]
        gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))
        await poll_until(lambda: host.runner("vocoder").pid == old_pid + 1 and len(gateway.pushes()) >= 2)
        new_address = host.address("vocoder")
        assert gateway.pushes()[-1] == ({group: (new_address,)}, ())
        pushed = len(gateway.pushes())

        workers[-1].exit(-9)
        await poll_until(lambda: len(workers) == old_pid - 100 + 3)  # the crash recovery's worker, held
        assert gateway.pushes()[pushed:] == [
            ({group: (new_address,)}, (new_address,)),  # what was sent to it fails
            ({group: (old_address,)}, ()),  # READY -> BACKOFF: the old worker takes the requests again
        ]
        gateway.requests = {"b"}
        await asyncio.sleep(0.1)
        assert old.signals == [] and not restarting.done()
        assert host.replicas.served_by_old() == {"vocoder"}  # the daemon still serves the group: not DEGRADED
        old.fall_silent()  # the old worker misses heartbeats: it still takes the requests, but answers none
        await poll_until(lambda: host.replicas.replaced["vocoder"].silence != "")
        assert host.replicas.served_by_old() == {"vocoder"} and host.replicas.served_by_old(answering=True) == set()
        old.beat()
        await poll_until(lambda: host.replicas.replaced["vocoder"].silence == "")
        assert host.replicas.served_by_old(answering=True) == {"vocoder"}

        workers[-1].answer()
        await poll_until(lambda: gateway.pushes()[-1] == ({group: (new_address,)}, ()))
        await asyncio.sleep(0.1)
        assert old.signals == [] and not restarting.done()  # "b" may be on the old worker
        gateway.requests = {"c"}  # came after the new worker was back
        assert await asyncio.wait_for(restarting, 5) == (old_pid, old_pid + 2)
        assert old.signals == ["TERM"]
        assert host.retired[-1][1] == f"restarted without a pause: pid {old_pid} -> {old_pid + 2}"
        assert host.replicas.replaced == {} and host.replicas.served_by_old() == set()
        await host.stop()

    run(scenario)


def test_a_new_worker_not_ready_again_by_the_end_of_the_drain_leaves_the_group_to_its_crash_recovery(caplog):
    """
    1. a restart without a pause switched `vocoder` to its new worker; the new worker dies, and the crash
       recovery's worker never gets READY (its stages hang);
    2. the old worker takes the group's requests until the drain timeout, then it is stopped anyway, saying
       so once, in the same words, in the log (a WARNING), to watchers (a WARNING outcome) and to the operator
       (the restart fails: the group is not serving, whatever pid its crash recovery has), and the group is
       announced with no worker.
    """

    async def scenario():
        host = await started(replicas=1, drain_timeout=0.3, launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        gateway, workers = host.gateway, host.launcher.workers
        group, old = host.address("vocoder"), workers[1]
        gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))
        await poll_until(lambda: host.runner("vocoder").pid == 102)
        workers[2].exit(-9)
        with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
            with pytest.raises(WorkerStartError) as failed:
                await asyncio.wait_for(restarting, 5)
        state = host.runner("vocoder").state
        await host.stop()
        return failed.value, state, old, group, gateway.pushes(), host.warned

    error, state, old, group, pushes, warned = asyncio.run(scenario())
    why = (
        "the new worker died after the switch and is STARTING, not READY, 0 s later; "
        "the old worker pid 101 is stopped anyway (requests still on it fail)"
    )
    assert (error.group, error.message, state) == ("vocoder", why, S.STARTING)
    assert error.advice == "its crash recovery goes on: `stagevisor events` shows when it is READY"
    assert old.signals == ["TERM"]
    assert pushes[-2:] == [({group: (group,)}, ()), ({group: ()}, ())]
    assert warned == [f"restart without a pause failed: {why}"]
    assert f"restart of 'vocoder' without a pause failed: {why}" in caplog.messages


def test_a_restart_whose_new_worker_is_down_ends_once_the_old_worker_it_falls_back_on_is_gone_too():
    """
    1. a restart without a pause switched `vocoder` to its new worker; the new worker dies and the crash
       recovery's worker never gets READY, so the old one takes the group's requests;
    2. the old worker dies too (or a shutdown stopped it): the restart fails at once, not at the end of the
       30 s drain, saying both are down (not "restarted"), and announces the group with no worker.
    """

    async def scenario():
        host = await started(replicas=1, launcher=FakeLauncher(["ready", "ready", "ready", "hang"]))
        gateway, workers = host.gateway, host.launcher.workers
        gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))
        await poll_until(lambda: host.runner("vocoder").pid == 102)
        workers[2].exit(-9)
        await poll_until(lambda: len(workers) == 4)
        workers[1].exit(-9)
        began = time.monotonic()
        with pytest.raises(WorkerStartError) as failed:
            await asyncio.wait_for(restarting, 5)
        # At once: not by the end of the drain (a loop that never awaits would also keep wait_for from firing).
        assert time.monotonic() - began < host.drain_timeout / 2
        await host.stop()
        return failed.value.message, host.warned, gateway.pushes()[-1]

    why, warned, last = asyncio.run(scenario())
    assert why.startswith("the new worker died after the switch and is ")
    assert why.endswith("; the old worker pid 101, which took the group's requests meanwhile, is STOPPED too")
    assert warned == [f"restart without a pause failed: {why}"]
    assert list(last[0].values()) == [()]


def test_a_drain_that_runs_out_stops_the_old_worker_and_counts_only_the_requests_it_may_hold(caplog):
    """
    1. a restart without a pause switched `vocoder` to its new worker; request "a" was in flight then, so the
       old worker may hold it; "c" comes after the switch (it went to the new worker);
    2. "a" outlives the drain timeout: the old worker is stopped anyway; the log counts one request left
       (not "c"), and the restart is a plain success for watchers (no --force was given).
    """

    async def scenario():
        host = await started(replicas=1, drain_timeout=0.2)
        gateway, old = host.gateway, host.launcher.workers[1]
        gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))
        await poll_until(lambda: host.runner("vocoder").pid == 102)
        gateway.requests = {"a", "c"}
        with caplog.at_level(logging.INFO, logger="stagevisor.daemon"):
            result = await asyncio.wait_for(restarting, 5)
        await host.stop()
        return result, old, host.retired, host.warned

    result, old, retired, warned = asyncio.run(scenario())
    assert result == (101, 102) and old.signals == ["TERM"]
    assert [outcome for _, outcome in retired] == ["restarted without a pause: pid 101 -> 102"] and warned == []
    assert "restart of 'vocoder': 1 request still in flight after 0 s" in caplog.messages
    assert not any("--force" in message for message in caplog.messages)


def test_a_new_worker_ready_again_gives_the_old_one_a_drain_timeout_more_never_past_twice_in_all(monkeypatch, caplog):
    """
    On a clock the test sets (drain timeout 10 s), with request "a" held on the old worker throughout:
    1. the new worker dies and is READY again at 6 s: the old one drains on, to 16 s (6 + 10), not to 10 s;
    2. it dies again and is READY again at 14 s: the old one drains to 20 s at most (twice the timeout in
       all), not to 24 s (14 + 10), and is stopped then with "a" still on it.
    """
    now = [0.0]
    monkeypatch.setattr(replicas_module, "time", type("Clock", (), {"monotonic": staticmethod(lambda: now[0])}))

    async def scenario():
        outcomes = ["ready", "ready", "ready", "held", "held"]
        host = await started(replicas=1, drain_timeout=10.0, launcher=FakeLauncher(outcomes))
        workers, old = host.launcher.workers, host.launcher.workers[1]
        host.gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder"))
        await poll_until(lambda: host.runner("vocoder").pid == 102)
        seen = []
        for index, back_at, later in ((2, 6.0, 12.0), (3, 14.0, 21.0)):
            workers[index].exit(-9)
            await poll_until(lambda count=index + 2: len(workers) == count)
            now[0] = back_at
            workers[index + 1].answer()
            # The drain took the new worker's return in (its new deadline counts from back_at) once it says so.
            assert await poll_until(lambda returns=index - 1: drains_again() == returns)
            now[0] = later
            # Whether the drain goes on past `later` is something that must not happen in round 1: a short sleep
            # gives a drain that wrongly ended (at 10 s) time to stop the old worker, which seen[0] would show.
            await asyncio.sleep(0.1)
            seen.append((restarting.done(), list(old.signals)))
        result = await asyncio.wait_for(restarting, 5)
        await host.stop()
        return seen, result, old.signals

    def drains_again() -> int:
        return sum("the new worker is READY again" in record.getMessage() for record in caplog.records)

    with caplog.at_level(logging.INFO, logger="stagevisor.daemon"):
        seen, result, signals = asyncio.run(scenario())
    assert seen[0] == (False, [])  # at 12 s: still draining (to 16 s)
    assert result == (101, 104) and signals == ["TERM"]  # stopped at 20 s, not 24 s


def test_a_cut_drain_stops_the_old_worker_at_once_with_its_requests_and_says_how_many(caplog):
    """
    1. a restart without a pause switched `vocoder` to its new worker; request "a" would keep the old one
       draining for the whole 30 s drain timeout;
    2. `cut` is set (a `--force` restart meanwhile): the old worker is stopped at once, and the log and the
       outcome say it went with one request in flight.
    """

    async def scenario():
        host = await started(replicas=1)
        old, cut = host.launcher.workers[1], asyncio.Event()
        host.gateway.requests = {"a"}
        restarting = asyncio.create_task(host.replicas.replace_worker("vocoder", cut=cut))
        await poll_until(lambda: host.runner("vocoder").pid == 102)
        await asyncio.sleep(0.05)
        assert not restarting.done() and old.signals == []
        began = time.monotonic()
        cut.set()
        with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
            result = await asyncio.wait_for(restarting, 5)
        elapsed = time.monotonic() - began
        await host.stop()
        return result, elapsed, old.signals, [outcome for _, outcome in host.retired], host.drain_timeout

    result, elapsed, signals, outcomes, drain_timeout = asyncio.run(scenario())
    assert result == (101, 102) and signals == ["TERM"]
    assert elapsed < drain_timeout / 2  # at once, not at the end of the drain
    assert outcomes == [
        "restarted without a pause: pid 101 -> 102 (--force stopped the old one with 1 request in flight)"
    ]
    assert "restart of 'vocoder': --force: the old worker stops with 1 request in flight" in caplog.messages
