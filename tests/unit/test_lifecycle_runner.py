"""GroupRunner drives the state machine from a fake launcher: crash -> backoff -> restart, limits, stops."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.group_runner import GroupRunner, RunnerHooks
from stagevisor.supervisor.launcher import Handshake, WorkerStartError
from stagevisor.supervisor.lifecycle import BackoffPolicy, GroupState
from stagevisor.supervisor.plan import ProcessGroup
from stagevisor.supervisor.worker_spec import WorkerSpec

S = GroupState


class FakeWorker:
    def __init__(self, pid: int, outcome: str) -> None:
        self.pid = pid
        self.outcome = outcome  # "ready", "fail", "hang", or "ignore-term"
        self.exited: asyncio.Future = asyncio.get_running_loop().create_future()
        self.wedged: asyncio.Future = asyncio.get_running_loop().create_future()
        self.signals: list[str] = []
        self.closed = False

    async def handshake(self, timeout: float) -> Handshake:
        if self.outcome == "fail":
            self.exit(1)
            raise WorkerStartError("g", "stage 'x' failed to build: boom", stage="x", traceback="Traceback ...")
        if self.outcome == "hang":
            await asyncio.sleep(3600)
        return Handshake(self.pid, fraction_enforced=False)

    async def wait_exit(self):
        return await asyncio.shield(self.exited)

    async def unresponsive(self) -> str:
        await self.wedged
        return f"worker pid {self.pid} did not answer its heartbeat for 5s"

    def wedge(self) -> None:
        """The worker's event loop stops answering (a stage blocked it, or SIGSTOP)."""
        if not self.wedged.done():
            self.wedged.set_result(None)

    def exitcode(self):
        return self.exited.result() if self.exited.done() else None

    def exit(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.outcome != "ignore-term":
            self.exit(-15)

    def kill(self) -> None:
        self.signals.append("KILL")
        self.exit(-9)

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.workers: list[FakeWorker] = []

    def start(self, spec: WorkerSpec) -> FakeWorker:
        outcome = self.outcomes.pop(0) if self.outcomes else "ready"
        worker = FakeWorker(100 + len(self.workers), outcome)
        self.workers.append(worker)
        return worker


class Recorder:
    def __init__(self) -> None:
        self.events, self.failures, self.lost, self.sleeps = [], [], [], []

    def hooks(self) -> RunnerHooks:
        return RunnerHooks(on_event=self.events.append, on_failure=self.failures.append,
                           on_worker_lost=lambda group, reason: self.lost.append((group, reason)))

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)

    def states(self) -> list[tuple[str, str]]:
        return [(e.old_state.value, e.new_state.value) for e in self.events]


SPEC = WorkerSpec(group=ProcessGroup("g", ("x",), None, None), stages=(), model_path=None, address="unix:/x")


def runner_for(launcher, recorder, *, max_restarts=3, stop_timeout=1.0):
    clock = iter(range(1000, 100000, 1))
    return GroupRunner(SPEC, launcher, BackoffPolicy(max_restarts=max_restarts, initial=0.5, max_delay=4.0),
                       recorder.hooks(), start_timeout=5.0, stop_timeout=stop_timeout,
                       clock=lambda: float(next(clock)), sleep=recorder.sleep)


async def settle(predicate, limit=1000):
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never reached")


def run(coro):
    return asyncio.run(coro)


def test_a_crashed_worker_is_reported_lost_and_restarted_after_backoff():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "ready"]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-9)
        await settle(lambda: runner.state is S.READY and runner.lifecycle.pid == 101)
        assert recorder.lost and "killed by SIGKILL" in recorder.lost[0][1]
        assert recorder.sleeps == [0.5]
        assert runner.lifecycle.restarts == 1
        assert ("READY", "BACKOFF") in recorder.states() and ("BACKOFF", "STARTING") in recorder.states()
        await runner.stop()
    run(scenario())


def test_a_worker_that_stops_answering_its_heartbeat_is_killed_and_replaced_like_a_crashed_one():
    """
    1. the READY worker's event loop stops answering (the fake's heartbeat wait returns);
    2. the runner SIGKILLs it and reports it lost, naming the missed heartbeat (its requests fail);
    3. the group goes through BACKOFF and is READY again with a new worker.
    """
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "ready"]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        wedged = launcher.workers[0]
        wedged.wedge()
        await settle(lambda: runner.state is S.READY and runner.lifecycle.pid == 101)
        assert wedged.signals == ["KILL"] and wedged.closed
        assert len(recorder.lost) == 1 and "did not answer its heartbeat" in recorder.lost[0][1]
        assert "did not answer its heartbeat" in recorder.failures[0].message
        assert ("READY", "BACKOFF") in recorder.states()
        await runner.stop()
    run(scenario())


def test_a_worker_that_beats_is_left_alone():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready"]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        for _ in range(100):
            await asyncio.sleep(0)
        assert launcher.workers[0].signals == [] and recorder.lost == []
        await runner.stop()
        assert launcher.workers[0].signals == ["TERM"]
    run(scenario())


def test_consecutive_start_failures_back_off_exponentially_then_fail():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "fail", "fail", "fail"]), Recorder()
        runner = runner_for(launcher, recorder, max_restarts=3)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(1)
        await settle(lambda: runner.state is S.FAILED)
        assert recorder.sleeps == [0.5, 1.0, 2.0]
        assert recorder.states()[-1] == ("STARTING", "FAILED")
        assert recorder.failures[1].stage == "x"
    run(scenario())


def test_operator_restart_replaces_the_worker_and_is_not_treated_as_a_crash():
    async def scenario():
        launcher, recorder = FakeLauncher([]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        old, new = await runner.restart()
        assert (old, new) == (100, 101)
        assert launcher.workers[0].signals == ["TERM"]
        assert recorder.lost == [] and recorder.sleeps == []
        assert recorder.states()[-4:] == [("READY", "STOPPING"), ("STOPPING", "STOPPED"),
                                          ("STOPPED", "STARTING"), ("STARTING", "READY")]
        await runner.stop()
    run(scenario())


def test_concurrent_restarts_of_one_group_share_one_new_worker():
    async def scenario():
        launcher, recorder = FakeLauncher([]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        first, second = await asyncio.gather(runner.restart(), runner.restart())
        assert first == second == (100, 101)
        assert len(launcher.workers) == 2 and runner.lifecycle.restarts == 1
        await runner.stop()
    run(scenario())


def test_restart_of_a_failed_group_starts_it_without_stopping_anything():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready"]), Recorder()
        runner = runner_for(launcher, recorder, max_restarts=0)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(1)
        await settle(lambda: runner.state is S.FAILED)
        await runner.restart()
        assert runner.state is S.READY and recorder.states()[-2:] == [("FAILED", "STARTING"), ("STARTING", "READY")]
        await runner.stop()
    run(scenario())


def test_stop_kills_a_worker_that_ignores_sigterm_after_the_stop_timeout():
    async def scenario():
        launcher, recorder = FakeLauncher(["ignore-term"]), Recorder()
        runner = runner_for(launcher, recorder, stop_timeout=0.01)
        runner.spawn()
        await runner.await_ready()
        await runner.stop()
        assert launcher.workers[0].signals == ["TERM", "KILL"]
        assert runner.state is S.STOPPED and launcher.workers[0].closed
    run(scenario())


def test_stop_is_idempotent():
    async def scenario():
        launcher, recorder = FakeLauncher([]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        await runner.stop()
        count = len(recorder.events)
        await runner.stop()
        assert len(recorder.events) == count and runner.state is S.STOPPED
    run(scenario())


def test_cancelling_a_pending_handshake_reaps_the_worker():
    async def scenario():
        launcher, recorder = FakeLauncher(["hang"]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        task = asyncio.create_task(runner.await_ready())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert launcher.workers[0].signals == ["KILL"] and runner.worker is None
        await runner.stop()
        assert recorder.states()[-2:] == [("STARTING", "STOPPING"), ("STOPPING", "STOPPED")]
    run(scenario())


def test_stop_during_backoff_ends_stopped_without_starting_a_worker():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready"]), Recorder()
        runner = runner_for(launcher, recorder)
        blocked = asyncio.Event()

        async def slow_sleep(delay):
            blocked.set()
            await asyncio.sleep(3600)

        runner._sleep = slow_sleep
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-11)
        await blocked.wait()
        assert runner.state is S.BACKOFF
        await runner.stop()
        assert runner.state is S.STOPPED and len(launcher.workers) == 1
    run(scenario())


def test_a_worker_exiting_during_daemon_shutdown_is_not_restarted():
    async def scenario():
        launcher, recorder = FakeLauncher([]), Recorder()
        runner = runner_for(launcher, recorder)
        runner.hooks.shutting_down = lambda: True
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(0)
        await settle(lambda: runner.state is S.STOPPED)
        assert len(launcher.workers) == 1 and recorder.sleeps == [] and recorder.failures == []
    run(scenario())
