"""The daemon's Prometheus counters across live changes: a group's restarts counted once across applies and scales."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.placement.planner import rescale
from tests.fakes import FakeLauncher, poll_until
from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon
from tests.unit.daemon.daemon_driver import AnnouncingGateway
from tests.unit.metrics.exposition import parse


def restarts_total(daemon: Daemon, worker: str) -> float:
    """stagevisor_group_restarts_total of `worker` as a scrape of /metrics reads it now."""
    assert daemon.monitor.metrics is not None
    return parse(daemon.monitor.metrics.registry)[("stagevisor_group_restarts_total", frozenset({("group", worker)}))]


async def crash_and_wait(daemon: Daemon, launcher: FakeLauncher, worker: str) -> None:
    """Kill `worker`'s process and wait (bounded) until its restart is READY."""
    before = daemon.runners[worker]
    crashed = next(w for w in launcher.workers if w.pid == before.pid)
    restarts = before.restarts
    crashed.exit(-9)
    runner = daemon.runners[worker]
    back = await poll_until(lambda: runner.restarts == restarts + 1 and runner.state.value == "READY")
    assert back, f"{worker} did not restart: {runner.state.value}, {runner.restarts} restarts"


def test_a_restart_right_after_an_apply_is_counted_though_no_scrape_saw_the_new_workers_count_at_zero(tmp_path):
    """
    1. `pipeline`'s worker crashes and restarts: a scrape reads restarts_total 1;
    2. an apply gives `pipeline` a new worker, whose own restart count starts at 0;
    3. that worker crashes and restarts before the next scrape, so its count is 1 again;
    4. the next scrape reads 2: before, it read 1 (the count was back where the last scrape left it, so the
       collector saw no change) and that restart was never counted.
    """

    async def scenario() -> tuple[float, float]:
        launcher = FakeLauncher([])
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway, backoff_initial=0.0)
        try:
            await crash_and_wait(daemon, launcher, "pipeline")
            first = restarts_total(daemon, "pipeline")
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")), 30)
            assert daemon.runners["pipeline"].restarts == 0
            await crash_and_wait(daemon, launcher, "pipeline")
            return first, restarts_total(daemon, "pipeline")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (1, 2)


def test_a_replica_a_scale_gives_back_counts_on_from_the_replica_it_replaces(tmp_path):
    """
    1. `pipeline` runs two replicas; `pipeline/1` crashes and restarts: a scrape reads its restarts_total 1;
    2. a scale to one replica and back to two gives `pipeline/1` a new worker, its count at 0;
    3. it crashes and restarts before the next scrape: that scrape reads 2, not 1.
    """

    async def scenario() -> tuple[float, float]:
        launcher = FakeLauncher([])
        plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway, backoff_initial=0.0)
        try:
            await crash_and_wait(daemon, launcher, "pipeline/1")
            first = restarts_total(daemon, "pipeline/1")
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)
            await asyncio.wait_for(daemon.scale_group("pipeline", 2), 30)
            assert daemon.runners["pipeline/1"].restarts == 0
            await crash_and_wait(daemon, launcher, "pipeline/1")
            return first, restarts_total(daemon, "pipeline/1")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (1, 2)


def test_an_operator_restart_without_a_pause_counts_one_restart_not_the_old_workers_again(tmp_path):
    """
    1. `pipeline`'s worker crashes and restarts: a scrape reads restarts_total 1;
    2. `stagevisor restart pipeline` starts a new runner beside the worker, which goes on with its count (2);
    3. the next scrape reads 2: the new runner's count is the old one's, continued, not a new count to add whole.
    """

    async def scenario() -> tuple[float, float, int]:
        launcher = FakeLauncher([])
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway, backoff_initial=0.0)
        try:
            await crash_and_wait(daemon, launcher, "pipeline")
            first = restarts_total(daemon, "pipeline")
            await asyncio.wait_for(daemon.restart_group("pipeline"), 30)
            return first, restarts_total(daemon, "pipeline"), daemon.runners["pipeline"].restarts
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (1, 2, 2)


def test_a_restart_no_scrape_saw_before_an_apply_retired_the_worker_is_still_counted(tmp_path):
    """
    1. a scrape reads `pipeline` at 0 restarts; its worker crashes and restarts (its runner's count is 1);
    2. an apply retires that runner before the next scrape, and gives `pipeline` a new one at 0;
    3. the next scrape reads 1: before, the retired runner's count left with it, and the restart was never counted.
    """

    async def scenario() -> tuple[float, float]:
        launcher = FakeLauncher([])
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway, backoff_initial=0.0)
        try:
            first = restarts_total(daemon, "pipeline")
            await crash_and_wait(daemon, launcher, "pipeline")
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")), 30)
            return first, restarts_total(daemon, "pipeline")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (0, 1)


def test_a_crash_while_a_restart_without_a_pause_starts_its_new_worker_is_counted_too(tmp_path):
    """
    1. `stagevisor restart pipeline` starts a new worker beside the one serving, which loads meanwhile;
    2. the serving worker crashes and its crash recovery starts another: two workers started after the first;
    3. the new worker is READY and takes the group: status and restarts_total say 2. Before, the new runner took
       its count when it was made (0 + 1), so the crash recovery's restart was counted nowhere.
    """

    async def scenario() -> tuple[int, float]:
        launcher = FakeLauncher(["ready", "held"])
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway, backoff_initial=0.0)
        try:
            assert restarts_total(daemon, "pipeline") == 0
            restarting = asyncio.create_task(daemon.restart_group("pipeline"))
            assert await poll_until(lambda: len(launcher.workers) == 2)
            launcher.workers[0].exit(-9)  # the serving worker
            assert await poll_until(lambda: daemon.runners["pipeline"].restarts == 1)
            launcher.workers[1].answer()  # the new worker is READY
            await asyncio.wait_for(restarting, 30)
            return daemon.runners["pipeline"].restarts, restarts_total(daemon, "pipeline")
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == (2, 2)


def test_an_operator_scale_is_an_event_naming_the_workers_after_it(tmp_path):
    """`stagevisor events` showed an autoscaling decision (AUTOSCALE) but nothing of an operator's `stagevisor
    scale` beyond the workers' own transitions: not the new count, nor that `pipeline/0` went on as `pipeline`.

    1. `pipeline` runs two replicas; the operator scales it to one, then to one again (nothing changes)
    2. one SCALED event, naming the worker left and its pid; the autoscaler's path publishes none
    """

    async def scenario() -> list[tuple[str, str]]:
        from tests.unit.daemon.daemon_driver import published_warnings

        launcher = FakeLauncher([])
        plan = rescale(cpu_plan("front", "front", "pipeline", "pipeline"), "pipeline", 2)
        daemon = await started_daemon(plan, tmp_path, launcher, AnnouncingGateway)
        events = daemon.subscribe()
        try:
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)
            await asyncio.wait_for(daemon.scale_group("pipeline", 2, operator=False), 30)
            pid = daemon.runners["pipeline/0"].pid
            return [
                (group, reason.replace(f"pid {pid}", "pid P")) for group, reason in published_warnings(events, "SCALED")
            ]
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    assert asyncio.run(scenario()) == [("pipeline", "from 2 to 1 replica by an operator: pipeline pid P")]
