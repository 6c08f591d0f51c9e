"""Daemon shutdown always ends with every worker stopped and its sockets removed, whatever fails on the way."""

from __future__ import annotations

import asyncio
import time

from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState
from stagevisor.supervisor.errors import DaemonError, WorkerStartError
from tests.fakes import settle
from tests.unit.daemon.daemon_driver import BrokenStopGateway, SwitchingGateway, cpu_plan, started_daemon
from tests.integration.daemon_helpers import higgs_isolated_audio_encoder
from tests.fakes import FakeLauncher


def test_a_failing_data_plane_stop_still_stops_every_worker_and_removes_the_sockets(tmp_path):
    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(higgs_isolated_audio_encoder(), tmp_path, launcher, gateway=BrokenStopGateway)
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
        daemon = await started_daemon(higgs_isolated_audio_encoder(), tmp_path, launcher, gateway=BrokenStopGateway)

        async def broken_stop(reason: str = "") -> None:
            raise RuntimeError("stop failed")

        daemon.runners["tts_frontend"].stop = broken_stop
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return daemon, launcher

    daemon, launcher = asyncio.run(scenario())
    others = [w for w in launcher.workers if w.pid != daemon.runners["tts_frontend"].pid]
    assert len(others) == 3 and all(worker.signals == ["TERM"] for worker in others)
    assert daemon.state is DaemonState.STOPPED and not (tmp_path / "d1").exists()


def test_the_shared_memory_area_is_removed_again_once_every_worker_has_stopped(tmp_path):
    """The data plane stops (removing the area) before the workers do; anything a worker made in it meanwhile
    would keep the area in /dev/shm after a clean shutdown (CI once found a cleanly stopped daemon's area left
    there). The daemon removes it again after the last worker has stopped."""
    seen: list[list[list[str]]] = []

    async def scenario():
        launcher = FakeLauncher([])

        class Recording(SwitchingGateway):
            def remove_shared_area(self) -> None:
                seen.append([list(worker.signals) for worker in launcher.workers])

        daemon = await started_daemon(higgs_isolated_audio_encoder(), tmp_path, launcher, gateway=Recording)
        await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    assert seen == [[["TERM"]] * 4]


def test_a_new_watcher_gets_the_recent_history_first_then_what_follows(tmp_path):
    """`stagevisor events` shows how the groups got where they are, not only a header until the next change."""

    async def scenario():
        daemon = await started_daemon(
            higgs_isolated_audio_encoder(), tmp_path, FakeLauncher([]), gateway=BrokenStopGateway
        )
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


def test_a_stop_during_an_apply_refuses_the_apply_and_leaves_none_of_its_new_workers_running(tmp_path):
    """
    1. the daemon runs one group; an apply to two groups starts its new workers, which never get READY;
    2. the daemon is asked to stop meanwhile;
    3. when shutdown returns, every worker is stopped, the apply's new ones too, and the apply is refused
       saying the daemon is stopping (not left waiting for workers of a daemon that has stopped).
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "hang", "hang"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
        await settle(lambda: len(launcher.workers) == 3)
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        running = [w.pid for w in launcher.workers if not w.exited.done()]
        if not applying.done():
            applying.cancel()
        refusal = (await asyncio.gather(applying, return_exceptions=True))[0]
        return running, refusal

    running, refusal = asyncio.run(scenario())
    assert running == []
    assert isinstance(refusal, DaemonError) and "stopping" in str(refusal) and "nothing changed" in str(refusal)


class BusyFirstGateway(SwitchingGateway):
    """The first gateway made (the running topology's) holds a request that never ends; later ones hold none."""

    made: list[BusyFirstGateway] = []

    def __init__(self, *args, admission=None) -> None:
        super().__init__(*args, admission=admission)
        self.busy = not BusyFirstGateway.made
        self.polls = 0
        BusyFirstGateway.made.append(self)

    def in_flight(self) -> int:
        self.polls += 1
        return 1 if self.busy else 0


def test_a_stop_while_an_apply_drains_the_old_topology_stops_its_workers_too(tmp_path):
    """
    1. an apply switched to the new topology; the old one still finishes a request (it never ends);
    2. the daemon is asked to stop;
    3. when shutdown returns, the old topology's workers are stopped too, not left to the apply's drain.
    """

    async def scenario():
        BusyFirstGateway.made = []
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher, gateway=BusyFirstGateway
        )
        old = launcher.workers[0]
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
        first = BusyFirstGateway.made[0]
        await settle(lambda: daemon.gateway is not first and first.polls > 0)  # the apply drains the old one
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        old_stopped = old.exited.done()
        applying.cancel()
        await asyncio.gather(applying, return_exceptions=True)
        return old_stopped, launcher

    old_stopped, launcher = asyncio.run(scenario())
    assert old_stopped
    assert len(launcher.workers) == 3 and all(w.exited.done() for w in launcher.workers)


def test_a_scale_that_waited_behind_an_apply_is_refused_once_a_stop_began(tmp_path):
    """
    1. an apply starts its new workers (they never get READY); a scale waits behind it;
    2. the daemon is asked to stop: the apply is refused;
    3. the scale, which now gets its turn, is refused too instead of starting replicas of a stopping daemon.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "hang", "hang"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
        await settle(lambda: len(launcher.workers) == 3)
        scaling = asyncio.create_task(daemon.scale_group("pipeline", 2))
        await asyncio.sleep(0)
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        results = await asyncio.wait_for(asyncio.gather(applying, scaling, return_exceptions=True), 30)
        return results, launcher

    (_, scaled), launcher = asyncio.run(scenario())
    assert isinstance(scaled, DaemonError) and "STOPP" in str(scaled)
    assert str(scaled).endswith("; it is shutting down: start a daemon again (`stagevisor serve`) to serve")
    assert len(launcher.workers) == 3 and all(w.exited.done() for w in launcher.workers)


def test_a_stop_during_a_forced_restart_does_not_wait_for_the_new_worker_to_load(tmp_path):
    """
    1. `stagevisor restart pipeline --force`: its new worker starts and loads (no handshake yet);
    2. `stagevisor stop` meanwhile: the shutdown stops that worker now and returns (it waited for the load to
       end, up to --start-timeout, ten minutes by default), and the restart is refused saying why.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "hang"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        restarting = asyncio.create_task(daemon.restart_group("pipeline", force=True))
        await settle(lambda: len(launcher.workers) == 2)
        await asyncio.wait_for(daemon.shutdown(0.0), 10)  # the fake's handshake never ends on its own
        refusal = (await asyncio.gather(restarting, return_exceptions=True))[0]
        return [w.exited.done() for w in launcher.workers], refusal

    exited, refusal = asyncio.run(scenario())
    assert exited == [True, True]
    assert isinstance(refusal, WorkerStartError) and "stopped while its new worker started" in refusal.message


def stop_while_a_new_worker_loads(tmp_path, change):
    """Start `change(daemon)` (a scale or a restart that starts one new worker), stop the daemon while that worker
    loads, and have it answer its handshake only after the stop has ended it: (the change's outcome, every
    worker exited)."""

    async def scenario():
        launcher = FakeLauncher(["ready", "held"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        changing = asyncio.create_task(change(daemon))
        await settle(lambda: len(launcher.workers) == 2)
        stopping = asyncio.create_task(daemon.shutdown(0.0))
        await settle(lambda: "TERM" in launcher.workers[1].signals)
        launcher.workers[1].answer()  # READY a moment too late: the stop has taken the worker over
        outcome = (await asyncio.wait_for(asyncio.gather(changing, return_exceptions=True), 30))[0]
        await asyncio.wait_for(stopping, 30)
        return outcome, [w.exited.done() for w in launcher.workers]

    return asyncio.run(scenario())


def test_a_scale_whose_new_replica_answers_after_a_stop_took_it_over_is_refused_saying_so(tmp_path):
    """Before: `Unexpected IllegalTransition: group 'pipeline/1': STOPPING -> READY is not allowed` to the
    operator, and an ERROR traceback in the daemon log."""
    refusal, exited = stop_while_a_new_worker_loads(tmp_path, lambda daemon: daemon.scale_group("pipeline", 2))
    assert exited == [True, True]
    assert isinstance(refusal, (WorkerStartError, DaemonError)), repr(refusal)
    assert "IllegalTransition" not in str(refusal) and "STOPP" in str(refusal).upper(), str(refusal)


def test_a_restart_whose_new_worker_answers_after_a_stop_took_it_over_is_refused_saying_so(tmp_path):
    """Before: `IllegalTransition: group 'pipeline': STOPPING -> READY ...; pid 100 serves on unchanged`, during a
    shutdown that was stopping pid 100 too."""
    refusal, exited = stop_while_a_new_worker_loads(tmp_path, lambda daemon: daemon.restart_group("pipeline"))
    assert exited == [True, True]
    assert isinstance(refusal, WorkerStartError), repr(refusal)
    assert "stopped while its new worker started" in refusal.message, refusal.message
    assert "serves on" not in refusal.advice


class BusyGateway(SwitchingGateway):
    """A gateway with one request in flight that never ends by itself."""

    def in_flight(self) -> int:
        return 1


def test_a_later_stop_with_a_shorter_grace_ends_the_drain_sooner_and_never_later(tmp_path):
    """`stop --grace 0` during a `stop --grace 30` drain was not read: the drain ran its 30 s."""

    async def scenario() -> tuple[float, bool]:
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")
        daemon = await started_daemon(plan, tmp_path, FakeLauncher([]), gateway=BusyGateway)
        shutdown = asyncio.create_task(daemon.shutdown(30.0))
        await asyncio.sleep(0.2)
        daemon.shorten_drain(60.0)  # a longer grace: the drain still ends within the first one
        early = daemon.drain_deadline.at
        started = asyncio.get_running_loop().time()
        daemon.shorten_drain(0.0)
        await asyncio.wait_for(shutdown, 10)
        return asyncio.get_running_loop().time() - started, early - started > 25

    took, kept = asyncio.run(scenario())
    assert took < 5 and kept


def test_the_service_reads_every_later_stop_while_the_shutdown_runs():
    """The service read one request off the daemon's queue, then only awaited the shutdown: a second `stop` or
    signal was never read. Now each shortens the drain (a signal to now), until the shutdown ends."""
    import signal
    from types import SimpleNamespace

    from stagevisor.supervisor.service import _shorten_drain_on_later_stops

    async def scenario() -> list:
        shortened: list = []
        daemon = SimpleNamespace(requests=asyncio.Queue(), shorten_drain=shortened.append)
        done = asyncio.Event()
        shutdown = asyncio.create_task(done.wait())
        reading = asyncio.create_task(_shorten_drain_on_later_stops(daemon, shutdown))  # type: ignore[arg-type]
        daemon.requests.put_nowait(("shutdown", 5.0))
        daemon.requests.put_nowait(("signal", signal.SIGINT))
        await settle(lambda: len(shortened) == 2)
        done.set()
        await asyncio.wait_for(reading, 5)  # it returns once the shutdown is done
        return shortened

    assert asyncio.run(scenario()) == [5.0, 0.0]


def test_a_drain_that_times_out_on_one_request_says_so_in_the_singular(caplog):
    """The warning read `drain timeout: 1 requests still in flight are cancelled`."""
    import logging

    from stagevisor.supervisor.daemon.shutdown import DrainDeadline, drain

    class OneLeft:
        def stop_accepting(self) -> None:
            pass

        def in_flight(self) -> int:
            return 1

    deadline = DrainDeadline()
    deadline.within(0.0)
    with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
        asyncio.run(drain(OneLeft(), deadline))
    assert "drain timeout: cancelling 1 request still in flight" in caplog.messages


def test_a_shutdown_drain_waits_for_the_requests_an_applys_old_topology_still_holds():
    """A SIGTERM while an apply's old topology finished its requests drained the daemon's own gateway alone (none
    in flight there) and stopped the old workers under them at once: those requests lived only as long as the
    worker's own stop drain. The drain now waits for them too, within its deadline."""
    from stagevisor.supervisor.daemon.shutdown import DrainDeadline, drain

    class Empty:
        def stop_accepting(self) -> None:
            pass

        def in_flight(self) -> int:
            return 0

    async def scenario() -> float:
        finished = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, finished.set)
        deadline = DrainDeadline()
        deadline.within(10.0)
        began = time.monotonic()
        await drain(Empty(), deadline, lambda: 0 if finished.is_set() else 1)
        assert finished.is_set()
        return time.monotonic() - began

    assert 0.3 <= asyncio.run(scenario()) < 5.0
