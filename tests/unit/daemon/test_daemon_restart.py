"""Daemon.restart_group on a fake launcher: restarts of one single-worker group at once share one new worker."""

from __future__ import annotations

import asyncio

from tests.fakes import poll_until, settle
from tests.unit.daemon.daemon_driver import published_warnings
from tests.unit.daemon.daemon_driver import HoldingGateway, cpu_plan, started_daemon
from tests.fakes import FakeLauncher
from stagevisor.supervisor.dataplane.admission import RESTART_RETRY_AFTER


def turns(count: int = 200):
    """Let the daemon's tasks run `count` loop turns (not wall time)."""

    async def run() -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    return run()


def test_two_restarts_without_a_pause_of_one_group_share_one_new_worker(tmp_path):
    """
    1. `front` and `pipeline` run; two operators restart `pipeline` while its new worker starts beside it;
    2. both get the same pids back, and one new worker was started (the old one stopped once).
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            first = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: len(launcher.workers) == 3)
            second = asyncio.create_task(daemon.restart_group("pipeline"))
            await turns()
            launcher.workers[2].answer()
            results = await asyncio.wait_for(asyncio.gather(first, second), 30)
            state = daemon.group_state("pipeline")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return results, state, launcher

    results, state, launcher = asyncio.run(scenario())
    assert results == [(101, 102), (101, 102)]
    assert len(launcher.workers) == 3 and launcher.workers[1].signals == ["TERM"]
    assert state.value == "READY"


def test_a_force_restart_while_a_restart_without_a_pause_starts_its_new_worker_shares_that_restart(tmp_path):
    """
    1. `stagevisor restart pipeline`: its new worker starts beside the old one (not READY yet);
    2. `stagevisor restart pipeline --force` meanwhile: it stops nothing and starts no third worker;
    3. once the new worker is READY, both get the same pids: one new worker, the old one drained and stopped.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            normal = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: len(launcher.workers) == 3)
            forced = asyncio.create_task(daemon.restart_group("pipeline", force=True))
            await turns()
            meanwhile = len(launcher.workers), list(launcher.workers[1].signals)
            launcher.workers[2].answer()
            results = await asyncio.wait_for(asyncio.gather(normal, forced), 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return meanwhile, results, launcher

    meanwhile, results, launcher = asyncio.run(scenario())
    assert meanwhile == (3, [])
    assert results == [(101, 102), (101, 102)]
    assert len(launcher.workers) == 3 and launcher.workers[1].signals == ["TERM"]


def test_a_restart_without_a_pause_right_after_a_force_restart_shares_the_force_restart(tmp_path):
    """
    1. `stagevisor restart pipeline --force`: it stops the worker, then starts a new one (not READY yet);
    2. `stagevisor restart pipeline` in the same loop turn, while the group still reads READY: it starts no
       worker beside, which would take over from the force restart's new worker and stop it;
    3. both get the same pids: one new worker.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            forced = asyncio.create_task(daemon.restart_group("pipeline", force=True))
            normal = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: len(launcher.workers) >= 3)
            await turns()
            meanwhile = len(launcher.workers)
            for worker in launcher.workers[2:]:
                worker.answer()
            results = await asyncio.wait_for(asyncio.gather(forced, normal), 30)
            pid = daemon.status().groups[1].pid
            signalled = [list(w.signals) for w in launcher.workers]
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return meanwhile, results, pid, signalled

    meanwhile, results, pid, signalled = asyncio.run(scenario())
    assert meanwhile == 3
    assert results == [(101, 102), (101, 102)] and pid == 102
    assert signalled == [[], ["TERM"], []]


def test_an_old_worker_that_dies_while_it_drains_after_a_restart_without_a_pause_is_not_restarted(tmp_path, caplog):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one still holds a
       request, so the restart waits for it;
    2. the old worker dies meanwhile: its request fails (the loss is reported), and the old worker, which
       the group no longer needs, is not restarted (that started a third worker, stopped again once the
       drain ended);
    3. the restart returns old pid -> new pid, the group READY on the new worker; the log says why the old one
       was not restarted (it said "daemon shutdown", with the daemon serving on).
    """
    import logging

    caplog.set_level(logging.INFO, logger="stagevisor.daemon")

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, HoldingGateway, backoff_initial=0.0
        )
        try:
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            events = daemon.events.subscribe()
            launcher.workers[1].exit(-9)
            await turns()
            spawned = len(launcher.workers)
            daemon.gateway.held = frozenset()
            result = await asyncio.wait_for(restarting, 30)
            state = daemon.group_state("pipeline")
            warnings = published_warnings(events)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return spawned, result, state, warnings

    spawned, result, state, warnings = asyncio.run(scenario())
    # Watchers learn that the requests it held failed (only the log said so).
    assert warnings == [
        (
            "pipeline",
            "the old worker, draining after a restart, was lost (worker pid 101 of group 'pipeline' exited "
            "unexpectedly (killed by SIGKILL)): the requests it held failed",
        )
    ]
    assert spawned == 3
    assert result == (101, 102) and state.value == "READY"
    stopped = [m for m in caplog.messages if m.startswith("restart: old worker") and "-> STOPPED" in m]
    assert stopped and all("a new worker replaced it" in m and "daemon shutdown" not in m for m in stopped), stopped


def test_a_force_restart_cuts_short_the_drain_of_a_restart_without_a_pause(tmp_path, caplog):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one holds a request that
       would keep it draining for the whole 30 s drain timeout;
    2. `stagevisor restart pipeline --force` meanwhile: the old worker is stopped at once (its request fails),
       no third worker starts, and both commands get the same pids;
    3. the log and watchers say the drain was cut short, and with how many requests in flight.
    """
    import logging

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, HoldingGateway
        )
        events = daemon.subscribe()
        try:
            normal = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            await turns()
            assert not normal.done() and launcher.workers[1].signals == []  # draining
            with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
                forced = await asyncio.wait_for(daemon.restart_group("pipeline", force=True), 5)
            results = forced, await asyncio.wait_for(normal, 5)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        seen = []
        while not events.empty():
            event = events.get_nowait()
            if event is not None:
                seen.append(event.reason)
        return results, launcher, seen

    results, launcher, seen = asyncio.run(scenario())
    assert results == ((101, 102), (101, 102))
    assert len(launcher.workers) == 3 and launcher.workers[1].signals == ["TERM"]
    assert "restart of 'pipeline': --force cuts the running restart's drain short" in caplog.messages
    assert "restart of 'pipeline': --force: the old worker stops with 1 request in flight" in caplog.messages
    assert "restarted without a pause: pid 101 -> 102 (--force stopped the old one with 1 request in flight)" in seen


def test_a_new_worker_that_fails_beside_a_serving_one_is_not_published_as_the_groups_state(tmp_path):
    """
    1. `stagevisor restart pipeline`: its new worker fails to start beside the old one, which serves on;
    2. watchers see the group READY throughout: no STOPPED -> STARTING -> STOPPED of the new worker as the
       group's (that went to the log), only the WARNING that the restart was refused.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "fail"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        events = daemon.subscribe()
        try:
            try:
                await asyncio.wait_for(daemon.restart_group("pipeline"), 30)
            except Exception as error:  # noqa: BLE001 - the refusal is what the operator sees
                refused = str(error)
            state = daemon.group_state("pipeline")
            await turns()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        published = []
        while not events.empty():
            event = events.get_nowait()
            if event is not None and event.group == "pipeline":
                published.append((event.old_state.value, event.new_state.value, event.kind))
        return refused, state, published

    refused, state, published = asyncio.run(scenario())
    assert "the new worker did not start beside pid 101" in refused
    assert state.value == "READY"
    before_shutdown = published[: next(i for i, p in enumerate(published) if p[1] == "STOPPING")]
    assert before_shutdown == [("READY", "READY", "WARNING")]


def test_the_daemon_serves_on_while_a_restarts_old_worker_takes_the_requests_of_its_dead_new_one(tmp_path):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one holds a request;
    2. the new worker dies and its crash recovery's worker is not READY yet: the old worker takes the group's
       requests, so the daemon stays SERVING (health and /ready too), not DEGRADED;
    3. the old worker dies too: nothing serves the group, the daemon is DEGRADED (and the restart fails);
    4. the crash recovery's worker is READY: SERVING again.
    """
    from stagevisor.supervisor.daemon.lifecycle import DaemonState
    from stagevisor.supervisor.errors import WorkerStartError

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "ready", "held"])
        plan = cpu_plan("front", "front", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, HoldingGateway, backoff_initial=0.0)
        serving: list[bool] = []
        daemon.serving_listeners.append(serving.append)
        states = []
        try:
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            launcher.workers[2].exit(-9)
            await settle(lambda: len(launcher.workers) == 4)
            await turns()
            states.append((daemon.runners["pipeline"].state.value, daemon.state))
            launcher.workers[1].exit(-9)
            await asyncio.wait({restarting}, timeout=5)
            states.append(daemon.state)
            launcher.workers[3].answer()
            await poll_until(lambda: daemon.state is DaemonState.SERVING)
            failed = isinstance(restarting.exception(), WorkerStartError)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return states, serving, failed

    states, serving, failed = asyncio.run(scenario())
    assert states == [("STARTING", DaemonState.SERVING), DaemonState.DEGRADED]
    assert serving[:2] == [False, True] and failed


def test_a_new_worker_that_dies_while_the_old_one_drains_fails_only_what_was_sent_to_it(tmp_path):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one still holds a
       request, so the restart waits for it;
    2. the new worker dies meanwhile: its address is announced lost (what was sent to it fails), the old one's
       as the group's set; the group's requests are not all failed (the old worker's among them);
    3. the crash recovery's worker is READY: the group's requests go to it; once the old worker's request
       ended, the restart returns old pid -> the pid READY now.
    """
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    class RecordingGateway(SwitchingGateway):
        held: frozenset[str] = frozenset({"request-1"})

        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.failed_groups: list[str] = []
            self.pushes: list[tuple[dict, tuple]] = []

        def request_ids(self) -> frozenset[str]:
            return self.held

        def fail_group(self, group: str, reason: str) -> None:
            self.failed_groups.append(group)

        def push_replicas(
            self, sets: dict[str, tuple[str, ...]], lost: tuple[str, ...], workers: object, names: object = None
        ) -> int:
            self.pushes.append((dict(sets), tuple(lost)))
            return 0

    async def scenario():
        launcher = FakeLauncher([])
        plan = cpu_plan("front", "front", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, RecordingGateway, backoff_initial=0.0)
        try:
            old_address = daemon.runners["pipeline"].spec.address
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            new_address = daemon.runners["pipeline"].spec.address
            launcher.workers[2].exit(-9)
            await settle(
                lambda: daemon.status().groups[1].pid == 103 and daemon.runners["pipeline"].state.value == "READY"
            )
            await turns()
            assert not restarting.done()
            daemon.gateway.held = frozenset()
            result = await asyncio.wait_for(restarting, 30)
            gateway = daemon.gateway
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return result, gateway, old_address, new_address

    result, gateway, old_address, new_address = asyncio.run(scenario())
    assert result == (101, 103)
    assert gateway.failed_groups == []
    losses = [sets for sets, lost in gateway.pushes if lost == (new_address,)]
    assert len(losses) == 1
    after = gateway.pushes[gateway.pushes.index((losses[0], (new_address,))) + 1]
    assert list(after[0].values()) == [(old_address,)] and after[1] == ()


def test_a_restart_that_waited_for_an_apply_making_its_group_one_worker_restarts_it_without_a_pause(tmp_path):
    """
    1. `pipeline` runs two replicas; an apply to one `pipeline` worker starts its new worker;
    2. `stagevisor restart pipeline` meanwhile waits for the apply (a rolling restart, as things stood);
    3. once the apply switched, the group has one worker: it is restarted as one, beside the running worker,
       not stopped first as a replica would be (every request failed while its replacement loaded);
    4. a `--force` restart meanwhile shares it, as it shares any restart of the group.
    """
    from stagevisor.supervisor.placement.planner import rescale

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held", "held"])
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(rescale(plan, "pipeline", 2), tmp_path, launcher)
        try:
            applying = asyncio.create_task(daemon.apply_plan(plan))
            await settle(lambda: len(launcher.workers) == 3)
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            await turns()
            launcher.workers[2].answer()  # the apply's worker: the switch
            await asyncio.wait_for(applying, 30)
            await settle(lambda: len(launcher.workers) == 4)
            signals_while_loading = list(launcher.workers[2].signals)
            forcing = asyncio.create_task(daemon.restart_group("pipeline", force=True))  # shares that restart
            await turns()
            launcher.workers[3].answer()  # the restart's new worker
            pids = await asyncio.wait_for(asyncio.gather(restarting, forcing), 30)
            started = len(launcher.workers)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return signals_while_loading, pids, started

    signals_while_loading, pids, started = asyncio.run(scenario())
    assert signals_while_loading == [] and pids == [(102, 103), (102, 103)] and started == 4


def test_while_a_crashed_group_waits_out_its_backoff_requests_failing_meanwhile_retry_when_it_is_expected_back(
    tmp_path,
):
    """
    1. a daemon restarts a crashed worker after 5 s of backoff;
    2. the vocoder's worker is killed: its group is in BACKOFF;
    3. a request failed meanwhile is told to retry in 6 s (the backoff and START_ALLOWANCE); before the crash the
       hint was the small constant of a crash the daemon has not seen yet.
    """

    async def scenario():
        launcher = FakeLauncher([])
        plan = cpu_plan("front", "front", "pipeline", "vocoder")
        daemon = await started_daemon(plan, tmp_path, launcher, backoff_initial=5.0)
        admission = daemon.gateway.admission
        try:
            ready = admission.retry_after_unavailable()
            launcher.workers[2].exit(-9)
            await settle(lambda: daemon.runners["vocoder"].state.value == "BACKOFF")
            return ready, admission.retry_after_unavailable()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    ready, backoff = asyncio.run(scenario())
    assert (ready, backoff) == (RESTART_RETRY_AFTER, 6)


def test_a_restart_that_a_scale_of_its_group_follows_reports_the_restarted_worker_s_state(tmp_path):
    """
    1. `stagevisor restart pipeline`: its new worker starts beside the old one;
    2. `stagevisor scale pipeline=2` meanwhile: it waits for the restart, then renames the worker `pipeline/0`
       and starts `pipeline/1` (not READY yet) before the restart's reply is written;
    3. the reply says READY, the restarted worker's state, not STARTING, the new replica's (the group's).
    """
    from stagevisor.supervisor._proto import admin_pb2
    from stagevisor.supervisor.admin.servicer import AdminServicer
    from tests.fakes import FakeServicerContext

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held", "held"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            request = admin_pb2.RestartGroupRequest(name="pipeline")
            restart = asyncio.create_task(AdminServicer(daemon).RestartGroup(request, FakeServicerContext()))
            await settle(lambda: len(launcher.workers) == 3)
            scale = asyncio.create_task(daemon.scale_group("pipeline", 2))
            await turns()
            launcher.workers[2].answer()
            reply = await asyncio.wait_for(restart, 30)
            states = {name: runner.state.value for name, runner in daemon.runners.items()}
            await settle(lambda: len(launcher.workers) == 4)
            launcher.workers[3].answer()
            await asyncio.wait_for(scale, 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return reply, states

    reply, states = asyncio.run(scenario())
    assert states == {"front": "READY", "pipeline/0": "READY", "pipeline/1": "STARTING"}
    assert (reply.old_pid, reply.new_pid, reply.state) == (101, 102, "READY")


def test_a_second_restart_without_force_shares_a_draining_restart_without_cutting_its_drain(tmp_path):
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    class HoldingGateway(SwitchingGateway):
        holding = True

        def request_ids(self) -> frozenset[str]:
            return frozenset({"request-1"}) if HoldingGateway.holding else frozenset()

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, HoldingGateway
        )
        try:
            first = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            second = asyncio.create_task(daemon.restart_group("pipeline"))
            await asyncio.sleep(0.2)  # ten of the drain's polls
            meanwhile = first.done(), second.done(), list(launcher.workers[1].signals)
            HoldingGateway.holding = False  # the request ends: the drain is over
            results = await asyncio.wait_for(asyncio.gather(first, second), 5)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return meanwhile, results

    meanwhile, results = asyncio.run(scenario())
    assert meanwhile == (False, False, [])  # still draining: not cut short
    assert results == [(101, 102), (101, 102)]


def test_a_restart_after_one_that_ended_restarts_the_worker_again(tmp_path):
    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            first = await asyncio.wait_for(daemon.restart_group("pipeline"), 10)
            second = await asyncio.wait_for(daemon.restart_group("pipeline"), 10)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return first, second

    assert asyncio.run(scenario()) == ((101, 102), (102, 103))


def test_a_force_restart_of_a_ready_worker_stops_it_before_its_new_worker_starts(tmp_path):
    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            forced = asyncio.create_task(daemon.restart_group("pipeline", force=True))
            await settle(lambda: len(launcher.workers) == 3)
            meanwhile = list(launcher.workers[1].signals)
            launcher.workers[2].answer()
            result = await asyncio.wait_for(forced, 10)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return meanwhile, result

    assert asyncio.run(scenario()) == (["TERM"], (101, 102))


def test_a_restart_while_the_daemon_starts_is_refused(tmp_path):
    import pytest

    from stagevisor.supervisor.daemon.core import Daemon
    from stagevisor.supervisor.daemon.options import DaemonOptions
    from stagevisor.supervisor.errors import DaemonError
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    async def scenario():
        launcher = FakeLauncher(["ready", "held"])
        daemon = Daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=launcher.factory,
            gateway_factory=SwitchingGateway,
        )
        starting = asyncio.create_task(daemon.start())
        try:
            await settle(lambda: len(launcher.workers) == 2)
            with pytest.raises(DaemonError) as refused:
                await asyncio.wait_for(daemon.restart_group("front"), 5)
            launcher.workers[1].answer()
            await asyncio.wait_for(starting, 10)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return str(refused.value)

    assert "while the daemon is STARTING" in asyncio.run(scenario())


def test_a_restart_without_a_pause_removes_the_old_worker_s_socket_once_it_stopped(tmp_path):
    from pathlib import Path

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            old = Path(daemon.specs["pipeline"].address.removeprefix("unix:"))
            old.touch()  # the fake worker makes no socket: one where the old worker listened
            await asyncio.wait_for(daemon.restart_group("pipeline"), 10)
            new = Path(daemon.specs["pipeline"].address.removeprefix("unix:"))
            return new != old, old.exists()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (True, False)


def test_a_force_restart_that_waited_for_a_scale_to_one_worker_stops_that_worker_first(tmp_path):
    """
    1. `pipeline` runs two replicas; `stagevisor scale pipeline=1` drains `pipeline/1`, which holds a request;
    2. `stagevisor restart pipeline --force` meanwhile waits for the scale (a rolling restart, as things stood);
    3. once the scale ends the group has one worker: --force restarts it as one, stopped first, not replaced
       without a pause beside it (as a restart without --force would be).
    """
    from stagevisor.supervisor.placement.planner import rescale
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    class HoldingGateway(SwitchingGateway):
        holding = True

        def replica_in_flight(self, replica: str) -> int:
            return int(self.holding)

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "ready", "held"])
        plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
        daemon = await started_daemon(plan, tmp_path, launcher, HoldingGateway)
        try:
            scaling = asyncio.create_task(daemon.scale_group("pipeline", 1))
            await settle(lambda: "pipeline/1" in daemon.replicas.draining)
            forcing = asyncio.create_task(daemon.restart_group("pipeline", force=True))
            await turns()
            waited = not forcing.done() and len(launcher.workers) == 3
            daemon.gateway.holding = False
            await asyncio.wait_for(scaling, 30)
            await settle(lambda: len(launcher.workers) == 4)  # the restart's new worker, loading
            await turns()
            signals_while_loading = list(launcher.workers[1].signals)
            launcher.workers[3].answer()
            result = await asyncio.wait_for(forcing, 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return waited, signals_while_loading, result

    assert asyncio.run(scenario()) == (True, ["TERM"], (101, 103))


def test_a_shutdown_while_a_restarts_old_worker_drains_stops_that_worker_too(tmp_path):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one holds a request, so
       it drains outside the topology;
    2. the daemon is stopped meanwhile: when shutdown returns, every worker has exited, the draining old
       one too (a worker left running past its daemon's shutdown holds its GPU memory).
    """

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, HoldingGateway
        )
        restarting = asyncio.create_task(daemon.restart_group("pipeline"))
        await settle(lambda: daemon.status().groups[1].pid == 102)
        await turns()
        draining = not restarting.done() and launcher.workers[1].signals == []
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        exited = [worker.exited.done() for worker in launcher.workers]
        daemon.gateway.held = frozenset()  # the restart ends either way (not after its 30 s drain timeout)
        await asyncio.wait_for(asyncio.gather(restarting, return_exceptions=True), 30)
        return draining, exited

    assert asyncio.run(scenario()) == (True, [True, True, True])


def test_a_restarts_old_worker_that_dies_while_it_drains_is_announced_lost_to_the_gateway(tmp_path):
    """
    1. `stagevisor restart pipeline`: the new worker is READY and the group's; the old one holds a request, so
       it drains;
    2. the old worker dies: the gateway is told its address is lost, so the requests it held fail at once
       (rather than waiting out their deadline on a worker that will never answer);
    3. the restart ends with the new worker serving the group.
    """
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    class RecordingGateway(SwitchingGateway):
        held: frozenset[str] = frozenset({"request-1"})

        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.lost: list[tuple[str, ...]] = []

        def request_ids(self) -> frozenset[str]:
            return self.held

        def push_replicas(
            self, sets: dict[str, tuple[str, ...]], lost: tuple[str, ...], workers: object, names: object = None
        ) -> int:
            self.lost.append(tuple(lost))
            return 0

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"),
            tmp_path,
            launcher,
            RecordingGateway,
            backoff_initial=0.0,
        )
        try:
            old_address = daemon.runners["pipeline"].spec.address
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: daemon.status().groups[1].pid == 102)
            await turns()
            before = [lost for lost in daemon.gateway.lost if lost]
            launcher.workers[1].exit(-9)  # the old worker, draining
            await turns()
            announced = [lost for lost in daemon.gateway.lost if lost]
            daemon.gateway.held = frozenset()
            result = await asyncio.wait_for(restarting, 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return before, announced, old_address, result

    before, announced, old_address, result = asyncio.run(scenario())
    assert before == [] and announced == [(old_address,)]
    assert result == (101, 102)
