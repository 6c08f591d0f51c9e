"""What the daemon's apply refuses before anything starts (the live switch itself runs in tests/integration)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from stagevisor.supervisor.daemon.lifecycle import DaemonState
from stagevisor.supervisor.errors import ConfigError, DaemonError, ErrorCode, PlacementError
from stagevisor.supervisor.placement.planner import rescale
from tests.fakes import settle
from tests.unit.daemon.daemon_driver import published_warnings
from tests.unit.daemon.daemon_driver import cpu_plan, started_daemon
from tests.fakes import FakeLauncher
from tests.integration.daemon_helpers import make_plan


def draining_gateways() -> tuple[type, list]:
    """A gateway class whose first instance (the first topology's) holds a request until its `holding` is set
    False, and the list of the instances made, in order."""
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    made: list = []

    class DrainingGateway(SwitchingGateway):
        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.holding = not made
            made.append(self)

        def in_flight(self) -> int:
            return int(self.holding)

    return DrainingGateway, made


def test_an_apply_for_another_model_is_refused_naming_the_model_path_to_give_apply(tmp_path):
    """`stagevisor apply --isolate-stage vocoder` without --model-path plans the default voice: against a daemon
    serving Higgs-TTS the refusal tells the operator which --model-path to add, not only to start another daemon."""

    async def scenario():
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, FakeLauncher([])
        )
        events = daemon.events.subscribe()
        try:
            with pytest.raises(PlacementError):  # a dry run refused is no apply refused: no event
                await daemon.apply_plan(
                    replace(cpu_plan("a", "b", "c", "d"), model="demo", model_path="demo"), dry_run=True
                )
            with pytest.raises(PlacementError) as refused:
                await daemon.apply_plan(replace(cpu_plan("a", "b", "c", "d"), model="demo", model_path="demo"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return refused.value, refusal_events(events)

    refusal, published = asyncio.run(scenario())
    assert refusal.code is ErrorCode.INVALID_CONFIG
    assert "--model-path test/higgs-tts" in refusal.message
    assert published == [f"apply refused: INVALID_CONFIG: {refusal.message}"]


def test_a_dry_run_is_refused_where_the_apply_would_be_for_want_of_room_on_the_gpu(tmp_path):
    """A dry run answered the difference (exit 0) for an apply the daemon then refused with OVER_LIMIT: both
    topologies hold GPU 0 during the switch (0.98 + 0.98). Now it is refused the same way, starting nothing and
    publishing nothing (a dry run changes nothing, so it is no apply refused)."""
    stages = ("preprocessing", "audio_encoder", "tts_engine", "vocoder")

    def gpu_plan(*processes: str):
        rows = zip(stages, processes, (None, 0, 0, 0), (None, 0.03, 0.85, 0.10), strict=True)
        return make_plan("higgs-tts", list(rows))

    async def scenario():
        launcher = FakeLauncher(["ready"] * 3)
        daemon = await started_daemon(gpu_plan("front", "front", "pipeline", "vocoder"), tmp_path, launcher)
        events = daemon.events.subscribe()
        try:
            with pytest.raises(PlacementError) as dry:
                await daemon.apply_plan(gpu_plan("front", "front", "pipeline", "pipeline"), dry_run=True)
            published = refusal_events(events)
            with pytest.raises(PlacementError) as real:
                await daemon.apply_plan(gpu_plan("front", "front", "pipeline", "pipeline"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return dry.value, real.value, published, len(launcher.workers)

    dry, real, published, spawned = asyncio.run(scenario())
    assert dry.code is real.code is ErrorCode.OVER_LIMIT and dry.message == real.message
    assert published == [] and spawned == 3


def refusal_events(events: asyncio.Queue) -> list[str]:
    """The reasons of the daemon-wide WARNING events published so far (a refused apply's)."""
    return [reason for group, reason in published_warnings(events) if not group]


def test_a_rolling_restart_waits_for_an_apply_instead_of_restarting_replicas_it_is_replacing(tmp_path):
    """
    1. `pipeline` runs two replicas; an apply starts the new topology's workers (they never get READY);
    2. `stagevisor restart pipeline` meanwhile: it waits for the apply (as a scale does) and stops no replica,
       instead of restarting workers the apply is about to retire, or, after the switch, the new ones by name.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "hang", "hang"])
        daemon = await started_daemon(
            rescale(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), "pipeline", 2), tmp_path, launcher
        )
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
        await settle(lambda: len(launcher.workers) == 4)
        restarting = asyncio.create_task(daemon.restart_group("pipeline"))
        for _ in range(100):  # loop turns, not wall time
            await asyncio.sleep(0)
        signalled = [list(w.signals) for w in launcher.workers[:2]]
        spawned = len(launcher.workers)
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        await asyncio.wait_for(asyncio.gather(applying, restarting, return_exceptions=True), 30)
        return signalled, spawned

    signalled, spawned = asyncio.run(scenario())
    assert signalled == [[], []] and spawned == 4


def test_a_forced_restart_waits_for_an_apply_and_restarts_the_group_the_daemon_then_runs(tmp_path):
    """`restart vocoder --force` while an apply starts its new topology restarted the old topology's worker at
    once and answered its pids (exit 0), a worker the apply then stopped; restarts and applies run one after the
    other."""

    async def scenario():
        launcher = FakeLauncher(["ready"] * 3 + ["held"] * 3)
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "vocoder"), tmp_path, launcher)
        old_vocoder = launcher.workers[2]
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "pipeline", "pipeline", "vocoder")))
        await settle(lambda: len(launcher.workers) == 6)  # the new topology's three workers, not READY yet
        restarting = asyncio.create_task(daemon.restart_group("vocoder", force=True))
        for _ in range(100):  # loop turns, not wall time
            await asyncio.sleep(0)
        waited = (old_vocoder.signals == [], len(launcher.workers) == 6, not restarting.done())
        for worker in launcher.workers[3:]:
            worker.answer()
        await asyncio.wait_for(applying, 30)
        old_pid, new_pid = await asyncio.wait_for(restarting, 30)
        running = daemon.runners["vocoder"].worker.pid
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return waited, old_pid, new_pid, running, [w.pid for w in launcher.workers]

    waited, old_pid, new_pid, running, pids = asyncio.run(scenario())
    assert waited == (True, True, True)
    assert (old_pid, new_pid, running) == (pids[5], pids[6], pids[6])


def test_an_apply_while_a_group_is_down_is_refused_naming_it_and_what_to_do(tmp_path):
    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "hang"])
        daemon = await started_daemon(
            cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher, backoff_initial=0.01
        )
        launcher.workers[1].exit(-9)  # pipeline's worker dies; its replacement never gets READY
        await settle(lambda: len(launcher.workers) == 3 and daemon.state is DaemonState.DEGRADED, limit=100_000)
        events = daemon.events.subscribe()
        try:
            with pytest.raises(DaemonError) as refused:
                await daemon.apply_plan(cpu_plan("a", "a", "a", "a"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        assert refusal_events(events) == [f"apply refused: {refused.value}"]
        return str(refused.value)

    message = asyncio.run(scenario())
    assert "DEGRADED" in message and "'pipeline' is STARTING" in message
    assert "stagevisor restart pipeline" in message and "SERVING" in message


def test_a_group_being_scaled_from_one_worker_keeps_its_name_for_restart_and_topology(tmp_path):
    """While `stagevisor scale pipeline=2` waits for its new replica (minutes for a model that loads weights),
    the running worker is already named `pipeline/0`: the group must still be known as `pipeline`, or
    `stagevisor restart pipeline` answers that there is no such group."""

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "hang"])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        scaling = asyncio.create_task(daemon.scale_group("pipeline", 2))
        await settle(lambda: len(launcher.workers) == 3)
        names = daemon.group_names()
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        await asyncio.wait_for(asyncio.gather(scaling, return_exceptions=True), 30)
        return names

    assert "pipeline" in asyncio.run(scenario())


def test_an_apply_whose_factory_the_daemon_cannot_import_is_refused_before_any_worker_starts(tmp_path):
    """Before: apply started the new workers, which failed to build (MODULE_NOT_FOUND) with advice it could not
    take (`put it next to the YAML config, or pass --app-dir`: apply has no --app-dir, and its workers import
    with the daemon's path, not its --config's directory)."""

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        started = len(launcher.workers)
        plan = cpu_plan("pipeline", "pipeline", "pipeline", "vocoder")
        plan = replace(
            plan, stages=tuple(replace(s, factory="myvoc:make") if s.name == "vocoder" else s for s in plan.stages)
        )
        try:
            with pytest.raises(ConfigError) as refused:
                await daemon.apply_plan(plan)
            return refused.value, len(launcher.workers) - started, daemon.state
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    error, new_workers, state = asyncio.run(scenario())
    assert error.code is ErrorCode.MODULE_NOT_FOUND and new_workers == 0 and state is DaemonState.SERVING
    assert "stage 'vocoder': factory 'myvoc:make' cannot be imported: no module 'myvoc'" in error.message
    assert "restart the daemon with --app-dir DIR (apply does not add its --config's directory)" in error.message
    assert "did you mean" not in error.message  # the standard library's `pydoc` is no typo of `myvoc`


def test_a_restart_of_a_group_an_apply_is_adding_waits_for_the_apply_and_restarts_the_new_group(tmp_path):
    """Before: `stagevisor restart vocoder` while `apply --isolate-stage vocoder` started its workers was refused at
    once ("no process group 'vocoder'"), though a restart issued during an apply waits for it."""

    async def scenario():
        launcher = FakeLauncher(["ready", "held", "held"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            applying = asyncio.create_task(daemon.apply_plan(cpu_plan("pipeline", "pipeline", "pipeline", "vocoder")))
            await settle(lambda: len(launcher.workers) == 3)
            restarting = asyncio.create_task(daemon.restart_group("vocoder"))
            await asyncio.sleep(0.05)
            waited = not restarting.done()
            for worker in launcher.workers[1:]:
                worker.answer()
            await asyncio.wait_for(applying, 30)
            old, new = await asyncio.wait_for(restarting, 30)
            return waited, old, new, daemon.runners["vocoder"].pid
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    waited, old, new, running = asyncio.run(scenario())
    assert waited and old != new and running == new


def test_the_launcher_is_told_the_workers_each_scale_and_apply_leaves_running(tmp_path):
    """It keeps standby workers by worker name: before, nobody told it when a scale or an apply removed or renamed
    a worker, and the standbys of workers gone lived on until the daemon stopped."""

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(cpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            await asyncio.wait_for(daemon.scale_group("pipeline", 2), 30)
            await asyncio.wait_for(daemon.scale_group("pipeline", 1), 30)
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline")), 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return launcher.adopted

    assert asyncio.run(scenario()) == [["front", "pipeline/0", "pipeline/1"], ["front", "pipeline"], ["pipeline"]]


def test_an_apply_refused_for_an_unexpected_error_logs_its_traceback(tmp_path, caplog):
    """
    1. an apply starts the new topology; the daemon's READY hook for its new group `front` raises KeyError;
    2. the apply is refused naming the class and the text, and nothing changes;
    3. the daemon log has the exception with its traceback (it had only the refusal's one line).
    """
    import logging

    from tests.unit.daemon.daemon_driver import SwitchingGateway

    class BrokenReadyHookGateway(SwitchingGateway):
        def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
            if group == "front":
                raise KeyError("front-limits")

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher, BrokenReadyHookGateway
        )
        try:
            with pytest.raises(DaemonError) as refused:
                await daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline"))
            groups = daemon.group_names()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return str(refused.value), groups

    with caplog.at_level(logging.ERROR, logger="stagevisor.daemon"):
        message, groups = asyncio.run(scenario())
    assert message.startswith("apply refused: the new topology did not start (KeyError: 'front-limits'")
    assert groups == ["pipeline"]
    logged = [r for r in caplog.records if r.exc_info is not None and r.exc_info[0] is KeyError]
    assert len(logged) == 1 and "the daemon failed while starting the new topology" in logged[0].getMessage()


def test_an_apply_whose_new_worker_fails_to_start_is_refused_with_the_workers_own_message(tmp_path):
    """The refusal read `(WorkerStartError: stage 'x' failed to build: boom)`: the class said nothing more."""

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "fail"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        try:
            with pytest.raises(DaemonError) as refused:
                await daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return str(refused.value)

    assert asyncio.run(scenario()) == (
        "apply refused: the new topology did not start (stage 'x' failed to build: boom); nothing changed"
    )


def test_an_old_topologys_worker_that_dies_while_the_apply_drains_it_is_not_restarted(tmp_path):
    """
    1. an apply switches to the new topology; the old one still holds a request, so its workers drain;
    2. the old worker dies meanwhile: it is not restarted (that started a worker for a topology nothing
       routes to, stopped again once the drain ended);
    3. the apply ends with the new topology serving.
    """
    DrainingGateway, made = draining_gateways()

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"),
            tmp_path,
            launcher,
            DrainingGateway,
            backoff_initial=0.0,
        )
        try:
            applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
            await settle(lambda: daemon.group_names() == ["front", "pipeline"])
            events = daemon.events.subscribe()
            launcher.workers[0].exit(-9)
            for _ in range(200):  # loop turns, not wall time
                await asyncio.sleep(0)
            spawned = len(launcher.workers)
            made[0].holding = False
            await asyncio.wait_for(applying, 30)
            state = daemon.state
            warnings = published_warnings(events)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return spawned, state, warnings

    spawned, state, warnings = asyncio.run(scenario())
    assert spawned == 3 and state is DaemonState.SERVING
    # Watchers learn that its requests failed (only the log said so).
    assert warnings == [
        (
            "pipeline",
            "a worker of the topology an apply replaced was lost while it drained (worker pid 100 of group "
            "'pipeline' exited unexpectedly (killed by SIGKILL)): its requests failed",
        )
    ]


@pytest.mark.parametrize("first", ["scale", "rolling restart"])
def test_a_change_whose_client_went_away_still_holds_off_the_next_change_until_it_ends(tmp_path, first):
    """
    1. a scale (a rolling restart) starts its new workers, which take long to get READY;
    2. its client goes away (Ctrl-C, the CLI's deadline): the change goes on, as it must not stop half-way;
    3. the operator runs an apply meanwhile: it waits for the first change to end, and starts no worker
       beside it (it switched away from the topology a scale was still adding replicas to).
    An apply whose client goes away is refused while its new workers start, and goes on once it has switched
    (the tests below).
    """

    async def scenario():
        plan = cpu_plan("front", "front", "pipeline", "pipeline")
        if first == "rolling restart":
            launcher = FakeLauncher(["ready", "ready", "ready", "hang"])
            daemon = await started_daemon(rescale(plan, "pipeline", 2), tmp_path, launcher)
            changing = asyncio.create_task(daemon.restart_group("pipeline"))
            await settle(lambda: len(launcher.workers) == 4)
        else:
            launcher = FakeLauncher(["ready", "ready", "hang", "hang"])
            daemon = await started_daemon(plan, tmp_path, launcher)
        if first == "scale":
            changing = asyncio.create_task(daemon.scale_group("pipeline", 2))
            await settle(lambda: len(launcher.workers) == 3)
        spawned = len(launcher.workers)
        changing.cancel()  # the client went away
        await asyncio.gather(changing, return_exceptions=True)
        second = asyncio.create_task(daemon.apply_plan(cpu_plan("a", "a", "a", "a")))
        for _ in range(200):  # loop turns, not wall time
            await asyncio.sleep(0)
        beside = len(launcher.workers) - spawned
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        await asyncio.wait_for(asyncio.gather(second, return_exceptions=True), 30)
        return beside

    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize("recovered", [False, True], ids=["in its backoff", "ready again"])
def test_an_apply_whose_new_worker_dies_before_the_switch_is_refused_and_the_running_topology_serves_on(
    tmp_path, recovered
):
    """
    1. an apply starts the new topology: `front`'s new worker is READY, `pipeline`'s still loads;
    2. `front`'s new worker dies meanwhile: its restart waits out a backoff, or (`recovered`, no backoff) its crash
       recovery has it READY again at once;
    3. `pipeline`'s gets READY: the apply is refused naming the crash, instead of switching to a topology with
       a group down (or one that lost a worker before it served) and retiring the running one, which served
       every group.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "held"])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"),
            tmp_path,
            launcher,
            backoff_initial=0.0 if recovered else 3600.0,
        )
        try:
            applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
            await settle(lambda: len(launcher.workers) == 3)
            launcher.workers[1].exit(-9)  # front's new worker
            if recovered:
                await settle(lambda: len(launcher.workers) == 4)  # its crash recovery's worker answers at once
            for _ in range(100):  # loop turns, not wall time (the recovered worker gets READY)
                await asyncio.sleep(0)
            launcher.workers[2].answer()
            refusal = (await asyncio.wait_for(asyncio.gather(applying, return_exceptions=True), 30))[0]
            serving = daemon.group_names(), daemon.state, list(launcher.workers[0].signals)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return refusal, serving

    refusal, (groups, state, signals) = asyncio.run(scenario())
    assert isinstance(refusal, DaemonError) and "exited unexpectedly" in str(refusal)
    assert groups == ["pipeline"] and state is DaemonState.SERVING and signals == []


def test_an_apply_whose_workers_get_ready_as_the_daemon_begins_stopping_is_refused_not_switched(tmp_path):
    """
    1. an apply starts its new worker; the daemon is asked to stop;
    2. the new worker gets READY while the shutdown's first step (stopping the autoscaler) runs, before the
       shutdown cancels the apply: the apply is refused saying the daemon is stopping, rather than switched
       to a topology whose workers the shutdown may already have listed to stop without the old ones;
    3. when shutdown returns every worker has exited.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "held"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        applying = asyncio.create_task(daemon.apply_plan(cpu_plan("a", "a", "a", "a")))
        await settle(lambda: len(launcher.workers) == 2)

        async def autoscaler_stopping() -> None:  # an autoscaled daemon awaits its autoscaler's task here
            launcher.workers[1].answer()
            for _ in range(200):  # loop turns, not wall time
                await asyncio.sleep(0)

        daemon.autoscaling.stop = autoscaler_stopping
        await asyncio.wait_for(daemon.shutdown(0.0), 30)
        outcome = (await asyncio.wait_for(asyncio.gather(applying, return_exceptions=True), 30))[0]
        return outcome, [w.exited.done() for w in launcher.workers]

    outcome, exited = asyncio.run(scenario())
    assert isinstance(outcome, DaemonError) and "began stopping" in str(outcome)
    assert exited == [True, True]


def test_an_apply_request_the_plan_rules_refuse_is_an_apply_refused_counted_and_announced(tmp_path):
    """The daemon plans what `stagevisor apply` sends; a request its planning refused (an unsafe edge) reached no
    apply, so `stagevisor_topology_applies_total{outcome="refused"}` and the event stream missed it."""
    from stagevisor.supervisor.placement.request import PlacementRequest

    async def scenario():
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, FakeLauncher([])
        )
        events = daemon.events.subscribe()
        unsafe = PlacementRequest("qwen3-tts", isolate_stages=("tts_engine",))
        try:
            with pytest.raises(PlacementError):  # a dry run refused is no apply refused
                await daemon.apply_request(unsafe, dry_run=True)
            with pytest.raises(PlacementError) as refused:
                await daemon.apply_request(unsafe)
            assert daemon.metrics is not None
            counted = daemon.metrics.registry.get_sample_value(
                "stagevisor_topology_applies_total", {"outcome": "refused"}
            )
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return refused.value, refusal_events(events), counted

    refusal, published, counted = asyncio.run(scenario())
    assert refusal.code is ErrorCode.UNSAFE_EDGE
    assert published == [f"apply refused: UNSAFE_EDGE: {refusal.message}"]
    assert counted == 1.0


def test_an_apply_of_a_config_takes_its_voices_map_with_its_topology_or_alone_and_a_refused_one_takes_nothing(
    tmp_path,
):
    """Before: `apply --config` with a new `voices` entry said "no change" and requests for the new name got 400
    (the map was read once, at start). Now the config's map replaces the daemon's: alone where the topology stays
    as it is (an APPLIED event names it), never on a dry run, never with an apply refused, and an apply without a
    config leaves it as it is."""
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    config = "model_path: demo\nvoices:\n  narrator: heart\n"

    async def scenario():
        daemon = await started_daemon(
            plan_placement(PlacementRequest("demo")), tmp_path, FakeLauncher([]), voice_names={"alloy": "heart"}
        )
        events = daemon.events.subscribe()
        seen = {}
        try:
            _, _, seen["dry"] = await daemon.apply_request(
                PlacementRequest(config_path="v.yaml", config_text=config), dry_run=True
            )
            seen["after dry run"] = dict(daemon.voice_names)
            with pytest.raises(PlacementError):  # another model: refused, so its map is not taken either
                await daemon.apply_request(
                    PlacementRequest(config_path="q.yaml", config_text="model_path: qwen3-tts\nvoices: {x: y}\n")
                )
            seen["after refusal"] = dict(daemon.voice_names)
            _, seen["diff"], seen["applied"] = await daemon.apply_request(
                PlacementRequest(config_path="v.yaml", config_text=config)
            )
            seen["after apply"] = dict(daemon.voice_names)
            _, _, seen["no config"] = await daemon.apply_request(PlacementRequest("demo"))
            seen["after no config"] = dict(daemon.voice_names)
            assert daemon.metrics is not None  # the topology did not change: no topology apply counted
            seen["counted"] = daemon.metrics.registry.get_sample_value(
                "stagevisor_topology_applies_total", {"outcome": "applied"}
            )
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return seen, published_warnings(events, "APPLIED")

    seen, applied_events = asyncio.run(scenario())
    assert seen["dry"].lines() == ["+ narrator -> heart", "- alloy (stood for heart)"]
    assert seen["after dry run"] == seen["after refusal"] == {"alloy": "heart"}
    assert not seen["diff"].changed and seen["applied"].changed
    assert seen["after apply"] == seen["after no config"] == {"narrator": "heart"}
    assert seen["no config"] is None
    assert applied_events == [("", "applied: voices + narrator -> heart; - alloy (stood for heart)")]
    assert not seen["counted"]


def test_an_old_topology_holding_one_request_past_the_drain_says_it_in_the_singular(tmp_path, caplog):
    """The warning read `apply: 1 requests still on the old topology after 0 s are cancelled`."""
    import logging

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    made: list = []

    class HoldingGateway(SwitchingGateway):
        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.holding = not made  # the first topology's gateway holds a request that never ends
            made.append(self)

        def in_flight(self) -> int:
            return int(self.holding)

    async def scenario():
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"),
            tmp_path,
            FakeLauncher([]),
            HoldingGateway,
            drain_timeout=0.0,
            request_limits=RequestLimits(request_timeout=0.1),
        )
        try:
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")), 30)
        finally:
            made[0].holding = False
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
        asyncio.run(scenario())
    assert "apply: cancelling 1 request still on the old topology after 0 s" in caplog.messages


def test_an_apply_naming_another_checkpoint_of_the_served_model_is_refused_before_its_directory_is_read(tmp_path):
    """The daemon serves Higgs-TTS from one checkpoint directory; an Apply naming another directory whose
    config.json names the same architecture (through --model-path or a config's `model_path`) was planned, so the
    daemon read a directory a client named and its new workers would load that one's weights. Now it is refused
    (INVALID_CONFIG, naming the served path), counted and announced, before planning: nothing starts."""
    import json

    from stagevisor.supervisor.placement.request import PlacementRequest

    served, other = tmp_path / "served", tmp_path / "other"
    for directory in (served, other):
        directory.mkdir()
        (directory / "config.json").write_text(
            json.dumps({"architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"]})
        )
    requests = (
        PlacementRequest(str(other)),
        PlacementRequest(config_path="c.yaml", config_text=f"model_path: {other}\n"),
    )

    async def scenario():
        launcher = FakeLauncher(["ready"] * 3)
        plan = replace(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), model_path=str(served))
        daemon = await started_daemon(plan, tmp_path / "run", launcher)
        events = daemon.events.subscribe()
        refusals = []
        try:
            for request in requests:
                with pytest.raises(ConfigError) as refused:
                    await daemon.apply_request(request)
                refusals.append(refused.value)
            _, same, _ = await daemon.apply_request(PlacementRequest(f"{served}/"), dry_run=True)  # the served path
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return refusals, refusal_events(events), len(launcher.workers), same

    refusals, published, spawned, same = asyncio.run(scenario())
    assert [r.code for r in refusals] == [ErrorCode.INVALID_CONFIG] * 2
    assert refusals[0].message.startswith(f"--model-path {str(other)!r} is not the model path the daemon serves")
    assert refusals[1].message.startswith(f"c.yaml's model_path {str(other)!r} is not the model path")
    assert f"give apply --model-path {served}" in refusals[0].message
    assert published == [f"apply refused: INVALID_CONFIG: {r.message}" for r in refusals]
    assert spawned == 1 and same.changed  # the served path plans (the declared topology, three groups)


AUTOSCALED_VOCODER = """\
model_path: demo
stages:
  - name: vocoder
    process: vocoder
processes:
  vocoder:
    autoscale: {min_replicas: 1, max_replicas: 3, target_first_audio_p90_seconds: 0.5}
"""


def test_an_apply_keeps_the_replicas_the_autoscaler_runs_unless_it_sets_the_count(tmp_path):
    """The autoscaler had grown `vocoder` to 2 replicas; `apply --config` of the very config the daemon runs planned
    it at its minimum, 1: "replicas 2 -> 1", every worker restarted to take capacity away under load. Now a group
    that stays autoscaled keeps its running count (within the new bounds): the same config is no change, and a
    count the request sets (--process-replicas) still wins."""
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    config = PlacementRequest(config_path="auto.yaml", config_text=AUTOSCALED_VOCODER)
    narrowed = PlacementRequest(config_path="auto.yaml", config_text=AUTOSCALED_VOCODER.replace("3", "1"))
    grown = rescale(plan_placement(config), "vocoder", 2)

    async def scenario():
        daemon = await started_daemon(grown, tmp_path, FakeLauncher(["ready"] * 3))
        try:
            _, same, _ = await daemon.apply_request(config, dry_run=True)
            _, within, _ = await daemon.apply_request(narrowed, dry_run=True)
            set_count = replace(config, process_replicas=("vocoder=1",))
            _, fewer, _ = await daemon.apply_request(set_count, dry_run=True)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return same, within, fewer

    same, within, fewer = asyncio.run(scenario())
    assert not same.changed, same.render()
    assert [g.details for g in within.groups if g.name == "vocoder"] == [("replicas 2 -> 1", "autoscale settings")]
    assert [g.details for g in fewer.groups if g.name == "vocoder"] == [("replicas 2 -> 1",)]


def test_an_apply_waiting_for_an_autoscaler_scale_keeps_the_count_that_scale_leaves(tmp_path):
    """
    1. the autoscaler scales `vocoder` from 1 to 2 replicas; its new replica still loads (the change lock held);
    2. `apply --config` of the very config the daemon runs arrives meanwhile and waits for the scale;
    3. the scale ends: the apply keeps the 2 replicas the autoscaler now runs, so the config is no change. Before,
       it read the count (1) before it waited, then "replicas 2 -> 1" restarted every worker under load.
    """
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    config = PlacementRequest(config_path="auto.yaml", config_text=AUTOSCALED_VOCODER)

    async def scenario():
        plan = plan_placement(config)
        launcher = FakeLauncher(["ready"] * len(plan.groups) + ["held"])
        daemon = await started_daemon(plan, tmp_path, launcher)
        try:
            scaling = asyncio.create_task(daemon.scale_group("vocoder", 2, operator=False))
            await settle(lambda: len(launcher.workers) == len(plan.groups) + 1)
            applying = asyncio.create_task(daemon.apply_request(config, dry_run=True))
            for _ in range(100):  # loop turns, not wall time: the apply plans, then waits for the lock
                await asyncio.sleep(0)
            launcher.workers[-1].answer()
            await asyncio.wait_for(scaling, 30)
            kept, diff, _ = await asyncio.wait_for(applying, 30)
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return kept, diff

    kept, diff = asyncio.run(scenario())
    assert not diff.changed, diff.render()
    assert kept.group("vocoder").replicas == 2


def test_an_apply_whose_client_goes_away_while_its_new_workers_start_is_refused_and_stops_them(tmp_path):
    """
    1. an apply starts its new topology; its new worker hangs while it builds (it would hold the change lock for
       up to --start-timeout, and only `stagevisor stop` ended it);
    2. its client goes away (Ctrl-C, a cancelled Apply RPC): the apply is refused, its new worker stopped, counted
       and announced; the running topology served throughout;
    3. the next apply goes ahead at once.
    """

    async def scenario():
        launcher = FakeLauncher(["ready", "hang"])
        daemon = await started_daemon(cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher)
        events = daemon.events.subscribe()
        try:
            applying = asyncio.create_task(daemon.apply_plan(cpu_plan("a", "a", "a", "a")))
            await settle(lambda: len(launcher.workers) == 2)
            applying.cancel()  # the client went away
            outcome = (await asyncio.wait_for(asyncio.gather(applying, return_exceptions=True), 30))[0]
            after = (
                launcher.workers[1].exited.done(),
                list(launcher.workers[0].signals),
                daemon.group_names(),
                daemon.state,
                refusal_events(events),
            )
            assert daemon.metrics is not None
            refused = daemon.metrics.registry.get_sample_value(
                "stagevisor_topology_applies_total", {"outcome": "refused"}
            )
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("a", "a", "a", "a")), 30)
            groups = daemon.group_names()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return outcome, after, refused, groups

    outcome, (stopped, signals, running, state, published), refused, groups = asyncio.run(scenario())
    assert isinstance(outcome, asyncio.CancelledError)
    assert stopped and signals == [] and running == ["pipeline"] and state is DaemonState.SERVING
    assert published == [
        "apply refused: its client went away (Ctrl-C, or a cancelled Apply call) before the new topology was READY; "
        "its new workers are stopped; nothing changed"
    ]
    assert refused == 1.0 and groups == ["a"]


def test_an_apply_whose_client_goes_away_after_the_switch_goes_on_and_holds_off_the_next_change(tmp_path):
    """Past the switch an apply must not stop half-way: its client going away while the old topology drains
    leaves it running to its end, and the next apply waits for it (starts no worker beside it)."""
    DrainingGateway, made = draining_gateways()

    async def scenario():
        launcher = FakeLauncher([])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher, DrainingGateway
        )
        try:
            applying = asyncio.create_task(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")))
            await settle(lambda: daemon.group_names() == ["front", "pipeline"])
            applying.cancel()  # the client went away while the old topology drains
            await asyncio.gather(applying, return_exceptions=True)
            second = asyncio.create_task(daemon.apply_plan(cpu_plan("a", "a", "a", "a")))
            for _ in range(200):  # loop turns, not wall time
                await asyncio.sleep(0)
            beside, old_signalled = len(launcher.workers), list(launcher.workers[0].signals)
            made[0].holding = False
            await asyncio.wait_for(second, 30)
            groups = daemon.group_names()
        finally:
            made[0].holding = False
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return beside, old_signalled, groups

    beside, old_signalled, groups = asyncio.run(scenario())
    assert beside == 3 and old_signalled == [] and groups == ["a"]


def recording_gateways() -> tuple[type, list]:
    """A gateway class that records, per instance, whom it was retired to when it stopped; and the instances."""
    from tests.unit.daemon.daemon_driver import SwitchingGateway

    made: list = []

    class RecordingGateway(SwitchingGateway):
        def __init__(self, *args, admission=None) -> None:
            super().__init__(*args, admission=admission)
            self.successor = None
            self.retired_when_stopped = None
            made.append(self)

        def retire(self, successor: object) -> None:
            self.successor = successor

        async def stop(self, grace: float) -> None:
            self.retired_when_stopped = self.successor

    return RecordingGateway, made


def test_a_refused_switch_retires_its_new_gateway_before_stopping_it_so_the_shared_queue_is_left_alone(tmp_path):
    gateway, made = recording_gateways()

    async def scenario():
        launcher = FakeLauncher(["ready", "ready", "fail"])
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, launcher, gateway
        )
        try:
            with pytest.raises(DaemonError):
                await daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    asyncio.run(scenario())
    assert len(made) == 2 and made[1].retired_when_stopped is made[0]


def test_an_apply_starts_its_workers_in_a_directory_of_their_own_and_keeps_the_run_directory(tmp_path):
    """The first topology lives in the run directory itself: retiring it removes its sockets, never the directory
    (the new topology's g1 is inside it)."""

    async def scenario():
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"), tmp_path, FakeLauncher([])
        )
        try:
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")), 30)
            addresses = [spec.address for spec in daemon.specs.values()]
            kept = (tmp_path / "d1").is_dir() and (tmp_path / "d1" / "g1").is_dir()
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return addresses, kept

    addresses, kept = asyncio.run(scenario())
    assert kept
    assert addresses and all(a.startswith(f"unix:{tmp_path / 'd1' / 'g1'}/") for a in addresses)


def test_the_old_topology_drains_for_as_long_as_a_request_may_run_not_only_the_drain_timeout(tmp_path, caplog):
    import logging

    from stagevisor.supervisor.dataplane.limits import RequestLimits

    gateway, made = draining_gateways()

    async def scenario():
        daemon = await started_daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"),
            tmp_path,
            FakeLauncher([]),
            gateway,
            drain_timeout=0.0,
            request_limits=RequestLimits(request_timeout=10.0),
        )

        async def request_ends() -> None:
            await asyncio.sleep(0.3)
            made[0].holding = False

        ending = asyncio.ensure_future(request_ends())
        try:
            await asyncio.wait_for(daemon.apply_plan(cpu_plan("front", "front", "pipeline", "pipeline")), 30)
        finally:
            await ending
            await asyncio.wait_for(daemon.shutdown(0.0), 30)

    with caplog.at_level(logging.WARNING, logger="stagevisor.daemon"):
        asyncio.run(scenario())
    assert not [m for m in caplog.messages if "still on the old topology" in m]


def test_an_apply_refused_for_want_of_fractions_on_a_cpu_only_host_says_how_to_plan_on_cpu_as_a_restart_does(tmp_path):
    """The demo declared on GPU 0 with no fractions, its workers on CPU here (no CUDA device): `restart` refused
    MISSING_FRACTION saying that `gpu: null` plans its stages as a CPU group; `apply` refused the same way without
    it. Both now say it, in one wording; where the workers run on a GPU, neither does."""
    stages = ("preprocessing", "audio_encoder", "tts_engine", "vocoder")

    def gpu_plan(*processes: str):
        return make_plan("higgs-tts", list(zip(stages, processes, (None, 0, 0, 0), (None,) * 4, strict=True)))

    async def refusals(device: str) -> tuple[PlacementError, PlacementError]:
        daemon = await started_daemon(gpu_plan("front", "front", "pipeline", "pipeline"), tmp_path, FakeLauncher([]))
        try:
            for runner in daemon.runners.values():
                runner.device = device
            with pytest.raises(PlacementError) as restart:
                await daemon.restart_group("pipeline")
            with pytest.raises(PlacementError) as apply:
                await daemon.apply_plan(gpu_plan("front", "front", "pipeline", "vocoder"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return restart.value, apply.value

    restart, apply = asyncio.run(refusals("cpu"))
    assert restart.code is apply.code is ErrorCode.MISSING_FRACTION
    hint = "run on CPU here, with no CUDA device, where no fraction applies: `gpu: null` on "
    assert restart.message.endswith(
        f" (its workers {hint}its stages 'tts_engine', 'vocoder' in a config, e.g. "
        "`stages: [{name: tts_engine, gpu: null}]`, plans it as a CPU group, which restarts beside itself and "
        "scales with no GPU budget)"
    ), restart.message
    assert apply.message.endswith(
        f" (the workers on GPU 0 {hint}the stages 'audio_encoder', 'tts_engine', 'vocoder' in a config, e.g. "
        "`stages: [{name: audio_encoder, gpu: null}]`, plans them as CPU groups, which an apply switches with no "
        "GPU budget)"
    ), apply.message
    on_gpu = asyncio.run(refusals("cuda:0"))
    assert [hint in refusal.message for refusal in on_gpu] == [False, False], on_gpu
