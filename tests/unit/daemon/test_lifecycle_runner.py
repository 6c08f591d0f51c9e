"""WorkerRunner drives the state machine from a fake launcher: crash -> backoff -> restart, limits, stops."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.daemon.runner import WorkerRunner
from stagevisor.supervisor.daemon.lifecycle import BackoffPolicy, GroupState
from stagevisor.supervisor.plan import ProcessGroup
from stagevisor.supervisor.worker.spec import WorkerSpec
from tests.fakes import FakeClock, FakeLauncher, RunnerRecorder, settle

S = GroupState

SPEC = WorkerSpec(group=ProcessGroup("g", ("x",), None, None), stages=(), model_path=None, address="unix:/x")


def runner_for(launcher, recorder, *, max_restarts=3, stop_timeout=1.0, clock=None, stable_after=30.0, sleep=None):
    """A runner on a clock that stands still unless the test advances it (its backoff sleeps the recorder's,
    unless `sleep` is given)."""
    policy = BackoffPolicy(max_restarts=max_restarts, initial=0.5, max_delay=4.0, stable_after=stable_after)
    return WorkerRunner(
        SPEC,
        launcher,
        policy,
        recorder.hooks(),
        start_timeout=5.0,
        stop_timeout=stop_timeout,
        clock=clock or FakeClock(),
        sleep=sleep or recorder.sleep,
    )


def run(coro):
    return asyncio.run(coro)


def test_a_crashed_worker_is_reported_lost_and_restarted_after_backoff():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "ready"]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher(["ready", "ready"]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher(["ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        for _ in range(100):
            await asyncio.sleep(0)
        assert launcher.workers[0].signals == [] and recorder.lost == []
        await runner.stop()
        assert launcher.workers[0].signals == ["TERM"]

    run(scenario())


def test_a_silent_worker_is_reported_when_it_misses_beats_and_again_when_it_beats_and_is_not_killed_for_it():
    """
    1. the READY worker misses a few heartbeats (short of its timeout): the runner reports it silent, once;
    2. it beats again: the runner reports that, and it can go silent and come back again;
    3. through all of it the worker is neither signalled nor reported lost; only the timeout kills.
    """

    async def scenario():
        launcher, recorder = FakeLauncher(["ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        worker = launcher.workers[0]
        for _ in range(2):
            worker.fall_silent()
            await settle(lambda: runner.silence != "")
            worker.beat()
            await settle(lambda: runner.silence == "")
        await settle(lambda: len(recorder.silences) == 4)
        assert recorder.silences == [("g", "worker pid 100 sent no heartbeat for 3s"), ("g", "")] * 2
        assert worker.signals == [] and recorder.lost == [] and runner.state is S.READY
        await runner.stop()

    run(scenario())


def test_silent_s_counts_from_when_the_runner_took_its_worker_for_silent_and_is_none_while_it_beats():
    async def scenario():
        clock, launcher, recorder = FakeClock(), FakeLauncher(["ready", "ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, clock=clock)
        runner.spawn()
        await runner.await_ready()
        beating = runner.silent_s()
        launcher.workers[0].fall_silent()
        await settle(lambda: runner.silence != "")
        at_once = runner.silent_s()
        clock.advance(4.5)
        later = runner.silent_s()
        launcher.workers[0].beat()
        await settle(lambda: runner.silence == "")
        again = runner.silent_s()
        launcher.workers[0].fall_silent()
        await settle(lambda: runner.silence != "")
        launcher.workers[0].wedge()  # killed at the heartbeat timeout, then restarted: its successor beats
        await settle(lambda: runner.state is S.READY and runner.lifecycle.pid == 101)
        await runner.stop()
        return beating, at_once, later, again, runner.silent_s()

    assert run(scenario()) == (None, 0.0, 4.5, None, None)


def test_a_silent_worker_that_dies_is_no_longer_silent_and_its_successor_starts_beating():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].fall_silent()
        await settle(lambda: runner.silence != "")
        launcher.workers[0].wedge()  # the heartbeat timeout: killed, then restarted
        await settle(lambda: runner.state is S.READY and runner.lifecycle.pid == 101)
        assert runner.silence == ""
        assert recorder.silences == [("g", "worker pid 100 sent no heartbeat for 3s")]
        await runner.stop()

    run(scenario())


def test_a_failure_while_following_silence_is_logged_and_leaves_the_worker_watched(caplog):
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder)

        def broken(worker: str, reason: str) -> None:
            raise RuntimeError("a hook that fails")

        runner.hooks.on_silence = broken
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].fall_silent()
        await settle(lambda: "following its worker's heartbeats failed" in caplog.text)
        assert runner.state is S.READY and runner.silence == "" and launcher.workers[0].signals == []
        launcher.workers[0].wedge()  # the heartbeat timeout still watches it
        await settle(lambda: runner.state is S.READY and runner.lifecycle.pid == 101)
        await runner.stop()

    run(scenario())


def test_consecutive_start_failures_back_off_exponentially_then_fail():
    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "fail", "fail", "fail"]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher([]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        old, new = await runner.restart()
        assert (old, new) == (100, 101)
        assert launcher.workers[0].signals == ["TERM"]
        assert recorder.lost == [] and recorder.sleeps == []
        assert recorder.states()[-4:] == [
            ("READY", "STOPPING"),
            ("STOPPING", "STOPPED"),
            ("STOPPED", "STARTING"),
            ("STARTING", "READY"),
        ]
        await runner.stop()

    run(scenario())


def test_concurrent_restarts_of_one_group_share_one_new_worker():
    async def scenario():
        launcher, recorder = FakeLauncher([]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher(["ready"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, max_restarts=0)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(1)
        await settle(lambda: runner.state is S.FAILED)
        await runner.restart()
        assert runner.state is S.READY and recorder.states()[-2:] == [("FAILED", "STARTING"), ("STARTING", "READY")]
        await runner.stop()

    run(scenario())


def test_stop_kills_a_worker_that_ignores_sigterm_after_the_stop_timeout_and_reports_it_lost():
    """Reported lost, so that the requests it held fail now, saying why."""

    async def scenario():
        launcher, recorder = FakeLauncher(["ignore-term"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, stop_timeout=0.01)
        runner.spawn()
        await runner.await_ready()
        await runner.stop()
        assert launcher.workers[0].signals == ["TERM", "KILL"]
        assert runner.state is S.STOPPED and launcher.workers[0].closed
        [(worker, reason)] = recorder.lost
        assert worker == "g" and "killed it" in reason
        # It may have drained or closed for too long: a message that says it ignored SIGTERM would blame it wrongly.
        assert "still running when its stop timeout ran out (0.0s after SIGTERM)" in reason
        assert "ignored SIGTERM" not in reason

    run(scenario())


async def stopped_while_draining(meanwhile) -> tuple[list[str], list[tuple[str, str]]]:
    """A READY worker given SIGTERM (a scale-down) drains; `meanwhile(worker)` happens to it then. The signals it
    got and the losses the runner reported, once its stop ended."""
    launcher, recorder = FakeLauncher(["ignore-term"]), RunnerRecorder()
    runner = runner_for(launcher, recorder, stop_timeout=3600.0)
    runner.spawn()
    await runner.await_ready()
    stopping = asyncio.create_task(runner.stop("scale vocoder to 1"))
    await settle(lambda: launcher.workers[0].signals == ["TERM"])
    meanwhile(launcher.workers[0])
    await asyncio.wait_for(stopping, 10)
    assert runner.state is S.STOPPED and launcher.workers[0].closed
    return launcher.workers[0].signals, recorder.lost


def test_a_worker_that_stops_answering_its_heartbeat_while_it_drains_is_killed_before_the_stop_timeout():
    """A replica given SIGTERM drains for up to --request-timeout (its stop timeout includes that grace); one
    that is SIGSTOPped, or whose event loop is blocked, never drains: the missed heartbeat ends the wait."""
    signals, lost = run(stopped_while_draining(lambda worker: worker.wedge()))
    assert signals == ["TERM", "KILL"]
    assert [worker for worker, _ in lost] == ["g"]  # what it held fails now


def test_a_worker_that_dies_while_it_drains_is_reported_lost_and_one_that_ends_its_drain_is_not():
    """A replica scaled away drains what it holds; killed (or crashing) meanwhile, it loses that. Before, a worker
    the runner was stopping was never reported lost unless the runner killed it, and the requests it held, handed
    on to it in full by their senders, waited for the pipeline's idle timeout."""

    signals, [(worker, reason)] = run(stopped_while_draining(lambda worker: worker.exit(-9)))
    assert signals == ["TERM"]
    assert worker == "g" and reason == "worker pid 100 of group 'g' died while it stopped (killed by SIGKILL)"
    assert run(stopped_while_draining(lambda worker: worker.exit(0))) == (["TERM"], [])  # drained and exited


def test_a_worker_gets_the_stop_timeout_it_was_started_with_though_its_group_was_rescaled_since():
    """A replica's worker drains for its group's drain grace, and was started knowing it has that plus
    --stop-timeout (WorkerSpec.stop_timeout). Scaled down to one worker, its runner takes the single worker's spec
    (no drain grace, a shorter stop timeout) for its next worker; stopping the one still running killed it at the
    shorter timeout, in the drain it had been told it may run."""

    async def scenario():
        launcher, recorder = FakeLauncher(["ignore-term"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, stop_timeout=3600.0)
        runner.spawn()
        await runner.await_ready()
        runner.stop_timeout = 0.01  # Daemon.rename_runner after `scale GROUP=1`
        stopping = asyncio.create_task(runner.stop("restart requested by operator"))
        await settle(lambda: launcher.workers[0].signals == ["TERM"])
        await asyncio.sleep(0.2)
        signals = list(launcher.workers[0].signals)
        launcher.workers[0].exit(0)  # its drain ends and it exits
        await asyncio.wait_for(stopping, 10)
        return signals, recorder.lost

    assert run(scenario()) == (["TERM"], [])


def test_stop_is_idempotent():
    async def scenario():
        launcher, recorder = FakeLauncher([]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher(["hang"]), RunnerRecorder()
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
        launcher, recorder = FakeLauncher(["ready"]), RunnerRecorder()
        blocked = asyncio.Event()

        async def slow_sleep(delay):
            blocked.set()
            await asyncio.sleep(3600)

        runner = runner_for(launcher, recorder, sleep=slow_sleep)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-11)
        await asyncio.wait_for(blocked.wait(), 10)
        assert runner.state is S.BACKOFF
        await runner.stop()
        assert runner.state is S.STOPPED and len(launcher.workers) == 1

    run(scenario())


def test_a_worker_exiting_during_daemon_shutdown_is_not_restarted():
    async def scenario():
        launcher, recorder = FakeLauncher([]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.hooks.not_restarted = lambda: "daemon shutdown"
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(0)
        await settle(lambda: runner.state is S.STOPPED)
        assert len(launcher.workers) == 1 and recorder.sleeps == [] and recorder.failures == []

    run(scenario())


def test_a_worker_that_stayed_ready_past_stable_after_starts_a_fresh_run_of_restarts():
    """
    1. with max_restarts=1, a worker crashes and is restarted (restart 1 of 1);
    2. the new worker stays READY for longer than stable_after, then crashes;
    3. that crash starts a new run of crashes: restart 1 of 1 again, not FAILED.
    """

    async def scenario():
        clock, launcher, recorder = FakeClock(), FakeLauncher([]), RunnerRecorder()
        runner = runner_for(launcher, recorder, max_restarts=1, clock=clock, stable_after=30.0)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-9)
        await settle(lambda: runner.lifecycle.pid == 101)
        clock.advance(31.0)
        launcher.workers[1].exit(-9)
        await settle(lambda: runner.lifecycle.pid == 102 or runner.state is S.FAILED)
        assert runner.state is S.READY and recorder.sleeps == [0.5, 0.5]
        assert "restart 1/1" in recorder.events[-3].reason
        await runner.stop()

    run(scenario())


def test_a_worker_that_crashes_before_stable_after_counts_towards_the_limit():
    async def scenario():
        clock, launcher, recorder = FakeClock(), FakeLauncher([]), RunnerRecorder()
        runner = runner_for(launcher, recorder, max_restarts=1, clock=clock, stable_after=30.0)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-9)
        await settle(lambda: runner.lifecycle.pid == 101)
        clock.advance(29.0)
        launcher.workers[1].exit(-9)
        await settle(lambda: runner.state is S.FAILED)
        assert len(launcher.workers) == 2 and recorder.sleeps == [0.5]

    run(scenario())


def test_reviving_a_failed_group_gives_it_a_fresh_restart_budget():
    """
    1. with max_restarts=1, a worker crashes and its restart fails to start: the group is FAILED;
    2. an operator restarts the group and it becomes READY;
    3. its next crash (right away, so no stable reset) is restarted again, as restart 1 of 1.
    """

    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "fail"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, max_restarts=1)
        runner.spawn()
        await runner.await_ready()
        launcher.workers[0].exit(-9)
        await settle(lambda: runner.state is S.FAILED)
        assert recorder.sleeps == [0.5]
        await runner.restart()
        assert runner.state is S.READY and runner.lifecycle.pid == 102
        launcher.workers[2].exit(-9)
        await settle(lambda: runner.lifecycle.pid == 103 or runner.state is S.FAILED)
        assert runner.state is S.READY and recorder.sleeps == [0.5, 0.5]
        await runner.stop()

    run(scenario())


async def ready_runner_whose_next_ready_hook_raises() -> tuple[FakeLauncher, RunnerRecorder, WorkerRunner]:
    """A READY runner (pid 100) whose daemon hook raises KeyError when its next worker (pid 101) is READY."""
    launcher, recorder = FakeLauncher(["ready", "ready"]), RunnerRecorder()
    runner = runner_for(launcher, recorder)

    def on_event(event):
        recorder.events.append(event)
        if event.new_state is S.READY and event.pid == 101:
            raise KeyError("vocoder-limits")

    runner.hooks.on_event = on_event
    runner.spawn()
    await runner.await_ready()
    return launcher, recorder, runner


def test_an_unexpected_error_in_a_restarted_workers_ready_hook_fails_the_group_and_stops_the_worker(caplog):
    """
    1. the worker crashes; its replacement answers the handshake, and the daemon's READY hook raises KeyError;
    2. the error used to leave the watch task unhandled ("Task exception was never retrieved"), the group READY
       with a worker nothing watched;
    3. now it is logged with its traceback, reported as the group's failure, the group is FAILED with the
       reason, and the new worker is stopped.
    """
    import logging

    async def scenario():
        launcher, recorder, runner = await ready_runner_whose_next_ready_hook_raises()
        watch = runner._watch_task
        launcher.workers[0].exit(-9)
        await settle(lambda: watch.done())
        return runner, launcher, recorder, watch

    with caplog.at_level(logging.ERROR, logger="stagevisor.daemon"):
        runner, launcher, recorder, watch = run(scenario())
    assert watch.exception() is None
    assert runner.state is S.FAILED and runner.worker is None
    assert launcher.workers[1].signals == ["TERM"] and launcher.workers[1].closed
    reason = "the daemon failed while taking its worker READY: KeyError: 'vocoder-limits'"
    assert recorder.events[-1].new_state is S.FAILED and recorder.events[-1].reason.startswith(reason)
    assert recorder.failures[-1].message.startswith(reason)
    logged = [r for r in caplog.records if "taking its restarted worker READY" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[0] is KeyError


def test_an_unexpected_error_in_an_operator_restarts_ready_hook_fails_the_group_and_stops_the_worker(caplog):
    """
    1. `stagevisor restart g --force`: the new worker answers the handshake, and the daemon's READY hook
       raises KeyError;
    2. the error used to reach the operator as it was, the group READY with a worker nothing watched;
    3. now, as after a crash (`ready_fault`): logged with its traceback, the group's failure, FAILED with the
       reason, the new worker stopped; the operator gets a WorkerStartError (INTERNAL) saying so.
    """
    import logging

    from stagevisor.supervisor.errors import WorkerStartError

    async def scenario():
        launcher, recorder, runner = await ready_runner_whose_next_ready_hook_raises()
        with pytest.raises(WorkerStartError) as refused:
            await runner.restart()
        return runner, launcher, recorder, f"{refused.value.message}; {refused.value.advice}"

    with caplog.at_level(logging.ERROR, logger="stagevisor.daemon"):
        runner, launcher, recorder, message = run(scenario())
    assert runner.state is S.FAILED and runner.worker is None and runner._watch_task is None
    assert launcher.workers[1].signals == ["TERM"] and launcher.workers[1].closed
    reason = "the daemon failed while taking its worker READY: KeyError: 'vocoder-limits'"
    assert recorder.events[-1].new_state is S.FAILED and recorder.events[-1].reason.startswith(reason)
    assert recorder.failures[-1].message.startswith(reason)
    assert message.startswith(reason)
    assert message.endswith("the group is FAILED; `stagevisor restart g` starts it again")
    logged = [r for r in caplog.records if "taking its restarted worker READY" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info[0] is KeyError


def test_a_stop_during_an_operator_restart_stops_the_new_worker_without_waiting_for_its_handshake():
    """
    1. `stagevisor restart g --force`: the old worker stops, the new one starts and loads (no handshake yet);
    2. the daemon stops meanwhile (or an apply retires the group): the new worker is stopped now, not once its
       handshake ends (a model's load, up to --start-timeout), and the group ends STOPPED;
    3. the operator's restart is answered that the group was stopped while its new worker started.
    """
    from stagevisor.supervisor.errors import WorkerStartError

    async def scenario():
        launcher, recorder = FakeLauncher(["ready", "hang"]), RunnerRecorder()
        runner = runner_for(launcher, recorder)
        runner.spawn()
        await runner.await_ready()
        restarting = asyncio.create_task(runner.restart())
        await settle(lambda: len(launcher.workers) == 2)
        await asyncio.wait_for(runner.stop(), 10)  # the fake's handshake never ends on its own
        refusal = (await asyncio.gather(restarting, return_exceptions=True))[0]
        return runner.state, launcher.workers[1].signals, refusal

    state, signals, refusal = run(scenario())
    assert state is S.STOPPED and signals == ["KILL"]
    assert isinstance(refusal, WorkerStartError) and "stopped while its new worker started" in refusal.message


def test_a_stop_while_an_operator_restart_stops_the_old_worker_starts_no_new_one():
    """
    1. `stagevisor restart g --force`: the old worker is being stopped (it ignores SIGTERM until the stop timeout);
    2. the daemon stops meanwhile: once the old worker is gone no new one starts (it would be stopped only
       after its handshake, a model's load), and the restart is refused saying the group was stopped.
    """
    from stagevisor.supervisor.errors import WorkerStartError

    async def scenario():
        launcher, recorder = FakeLauncher(["ignore-term", "hang"]), RunnerRecorder()
        runner = runner_for(launcher, recorder, stop_timeout=0.05)
        runner.spawn()
        await runner.await_ready()
        restarting = asyncio.create_task(runner.restart())
        await settle(lambda: runner.state is S.STOPPING)
        await asyncio.wait_for(runner.stop(), 10)  # the fake's handshake never ends on its own
        refusal = (await asyncio.gather(restarting, return_exceptions=True))[0]
        return runner.state, len(launcher.workers), refusal

    state, started, refusal = run(scenario())
    assert state is S.STOPPED and started == 1
    assert isinstance(refusal, WorkerStartError) and "stopped while its new worker started" in refusal.message


def test_a_worker_in_backoff_says_how_long_until_it_is_started_again():
    async def scenario():
        clock, launcher, recorder = FakeClock(), FakeLauncher(["ready", "ready"]), RunnerRecorder()
        backoff = asyncio.Event()
        seen: list[float | None] = []

        async def sleep(delay):
            clock.advance(0.2)
            seen.append(runner.restart_in())
            await backoff.wait()

        runner = runner_for(launcher, recorder, clock=clock, sleep=sleep)
        assert runner.restart_in() is None
        runner.spawn()
        await runner.await_ready()
        assert runner.restart_in() is None  # READY
        launcher.workers[0].exit(-9)
        await settle(lambda: seen)
        assert runner.state is S.BACKOFF and seen == [pytest.approx(0.3)]  # the 0.5 s backoff, 0.2 s of it gone
        backoff.set()
        await settle(lambda: runner.state is S.READY)
        assert runner.restart_in() is None
        await runner.stop()

    run(scenario())
