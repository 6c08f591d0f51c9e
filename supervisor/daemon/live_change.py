"""Live topology changes (`stagevisor apply`): a new topology started beside the running one, the switch to it, and
the retirement of the old one; and the change lock, under which an apply, a scale and a restart beside a worker
run one at a time.

Every worker of the new plan starts beside the running ones, in its own directory (run_dir/g<generation>), behind
a second gateway (sharing admission control); once all are READY, new requests go to them, requests in flight
finish on the old workers (as long as --request-timeout lets them), then the old workers and gateway stop. The
daemon (a ChangeHost) makes the runners and takes the new topology as its own; LiveChange decides when, after
apply_checks.py's refusals (what an apply refuses before it starts anything).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, Mapping, Protocol, TypeVar

from stagevisor.supervisor.daemon.apply_checks import check_model_path, check_switchable, other_model, unimportable
from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState, LifecycleEvent
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.runner import SHUTDOWN, Failure, RunnerHooks, WorkerRunner
from stagevisor.supervisor.daemon.runtime_files import make_private_dir, remove_private_tree
from stagevisor.supervisor.daemon.shutdown import step
from stagevisor.supervisor.daemon.specs import gateway_addresses
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.errors import (
    DaemonError,
    PlacementError,
    StagevisorError,
    WorkerStartError,
)
from stagevisor.supervisor.config.voices import VoiceNamesChange, unknown_voice_targets
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.placement.diff import TopologyDiff, topology_diff
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.worker.spec import WorkerSpec

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+; this project supports 3.10
    from stagevisor.supervisor.metrics.registry import DaemonMetrics
    from stagevisor.supervisor.placement.request import PlacementRequest

log = logging.getLogger("stagevisor.daemon")


class SwitchGateway(Protocol):
    """What a switch asks of a gateway: the old one's admission control, limits and metrics go to the new one,
    which starts, then takes new requests from the old one (`retire`); each stops once its workers do."""

    admission: Admission
    """Admission control for every transport's requests; the daemon's drain rejects its queue."""
    limits: RequestLimits
    """Per-request caps the public endpoints enforce; set from DaemonOptions.request_limits."""
    metrics: DaemonMetrics | None
    """Where worker reports and request meters go; the daemon sets it (None with metrics off)."""

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...

    def in_flight(self) -> int: ...

    def fail_group(self, group: str, reason: str) -> None: ...

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        """A group's worker became READY declaring this text limit (None: it declares none)."""

    def retire(self, successor: Self) -> None:
        """Hand new requests to the gateway of a topology applied live; requests in flight here go on."""


G = TypeVar("G", bound=SwitchGateway)
"""The daemon's gateway (core.py's GatewayT)."""
T = TypeVar("T")


async def run_locked(lock: asyncio.Lock, change: Callable[[], Awaitable[T]]) -> T:
    """Run `change` under `lock` (the change lock) to its end: a caller cancelled while it runs (an admin client
    that went away, a CLI deadline) leaves it running and holding the lock until it ends, so the next change
    waits for it instead of changing the topology beside it. A caller cancelled while it waits changes nothing.
    """
    await lock.acquire()
    task = asyncio.ensure_future(change())
    task.add_done_callback(lambda _task: lock.release())
    return await asyncio.shield(task)


class ChangeHost(Protocol[G]):
    """What a live change needs from its daemon (core.py's Daemon)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> DaemonState: ...

    @property
    def options(self) -> DaemonOptions: ...

    @property
    def metrics(self) -> DaemonMetrics | None: ...

    @property
    def gateway(self) -> G: ...

    @property
    def gateway_factory(self) -> Callable[..., G]:
        """(plan, stage -> worker address, sink address, *, admission) -> a gateway."""

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name -> its runner, in plan order."""

    @property
    def hooks(self) -> RunnerHooks:
        """How the topology's runners report to the daemon."""

    @property
    def specs(self) -> Mapping[str, WorkerSpec]: ...

    @property
    def sink_address(self) -> str: ...

    retiring: list[WorkerRunner]
    """Runners outside the topology that a shutdown stops too."""

    voice_names: Mapping[str, str]
    """The config's `voices` map the HTTP API answers to; an apply of a config replaces it."""

    def voices(self) -> list[dict[str, Any]]:
        """The voices the executors declared."""

    def specs_for(self, plan: Plan, *, run_dir: Path, gateway: G) -> dict[str, WorkerSpec]:
        """The WorkerSpecs of `plan`'s workers in `run_dir`, for `gateway`'s shared memory."""

    def make_runner(self, spec: WorkerSpec, hooks: RunnerHooks) -> WorkerRunner: ...

    async def adopt_topology(
        self,
        plan: Plan,
        specs: dict[str, WorkerSpec],
        sink: str,
        gateway: G,
        runners: dict[str, WorkerRunner],
        hooks: RunnerHooks,
    ) -> None:
        """Run the new topology (every worker READY) from now on: its runners report through `hooks` as the
        daemon's own."""

    def publish(self, event: LifecycleEvent) -> None: ...


class LiveChange(Generic[G]):
    """Applies new plans to a running daemon: one change at a time, all or nothing, without failing a request."""

    def __init__(self, host: ChangeHost[G], run_dir: Path) -> None:
        self.host = host
        self.run_dir = run_dir
        self.generation = 0
        """How many times `apply` has switched topology: each switch runs in run_dir/g<generation>."""
        self._lock: asyncio.Lock | None = None
        self._starting: asyncio.Task[None] | None = None
        """An apply whose new workers are starting: a shutdown cancels it (they stop, the apply is refused)."""
        self._retired: G | None = None
        """An apply's old gateway while the requests it holds finish: a shutdown's drain waits for them too."""

    @property
    def generation_dir(self) -> Path:
        """Where the current topology's sockets live: the run directory, then run_dir/g<n> after each apply."""
        return self._directory(self.generation)

    def _directory(self, generation: int) -> Path:
        return self.run_dir / f"g{generation}" if generation else self.run_dir

    def lock(self) -> asyncio.Lock:
        """Held while an apply, a scale or a restart beside a worker changes the topology: one at a time."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def apply(self, plan: Plan, *, dry_run: bool = False) -> TopologyDiff:
        """Move the running daemon to `plan` without failing a request, or refuse and change nothing.

        PlacementError when `plan` is another model's or both topologies would
        not fit a GPU during the switch; DaemonError when the daemon is not
        serving or a new worker does not start (its cause included; the new
        workers are stopped, the running ones untouched).
        """
        return (await self._apply_checked(plan, dry_run, None))[1]

    async def _apply_checked(
        self, plan: Plan, dry_run: bool, counts_given: frozenset[str] | None
    ) -> tuple[Plan, TopologyDiff]:
        """`apply`, answering the plan applied: with `counts_given` (the groups whose count the request sets), `plan`
        keeps the replicas the autoscaler runs for every other group that stays autoscaled, read under the change
        lock."""
        host = self.host
        refusal = unimportable(plan, host.options.import_paths) or other_model(plan, host.plan)
        if refusal is not None:
            if not dry_run:
                self._refused(refusal)
            raise refusal
        attempt = _Attempt()
        try:
            return await run_locked(self.lock(), lambda: self._apply(plan, dry_run, counts_given, attempt))
        except asyncio.CancelledError:
            await self._abandon(attempt)
            raise

    async def _abandon(self, attempt: _Attempt) -> None:
        """The client of an apply went away (Ctrl-C, a cancelled Apply RPC): while its new workers still start, the
        apply is refused (they stop, the running topology serves on); once it has switched, it goes on to its end."""
        switch = attempt.switch
        if switch is None or switch is not self._starting or switch.done():
            return  # waiting for the lock (nothing started), or past the switch (the change must not stop half-way)
        attempt.client_gone = True
        log.info("apply: its client went away while the new workers started; the apply is refused, stopping them")
        switch.cancel()
        # Until its new workers are stopped and its refusal told: the next change waits for this one anyway.
        await asyncio.gather(switch, *([attempt.task] if attempt.task else []), return_exceptions=True)

    async def apply_request(
        self, request: PlacementRequest, *, dry_run: bool = False
    ) -> tuple[Plan, TopologyDiff, VoiceNamesChange | None]:
        """Plan `request` with the `plan` rules, then `apply` it: a request the rules refuse (StagevisorError) is an
        apply refused as well, counted and announced as one. A request with a config also sets the config's `voices`
        map (the names clients may send) once its topology runs, or at once when that stays as it is: its change is
        the third value (None without a config)."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent
        from stagevisor.supervisor.placement.request import plan_placement, replica_counts_given, voice_names

        try:
            check_model_path(request, self.host.plan)
            planned = plan_placement(request)
            voices = voice_names(request)
        except StagevisorError as error:
            if not dry_run:
                self._refused(error)
            raise
        plan, diff = await self._apply_checked(planned, dry_run, replica_counts_given(request))
        if voices is None:
            return plan, diff, None
        host = self.host
        change = VoiceNamesChange(dict(host.voice_names), voices, tuple(unknown_voice_targets(host.voices(), voices)))
        if change.changed and not dry_run:
            host.voice_names = voices
            text = "; ".join(change.lines())
            log.info("apply: the config's voice names changed: %s", text)
            for problem in change.unknown:
                log.warning("%s", problem)
            if not diff.changed:  # a topology change announces itself (APPLIED); this names the voices alone
                # (not counted in stagevisor_topology_applies_total: the topology did not change)
                host.publish(ConditionEvent.now("", GroupState.READY, f"applied: voices {text}", "APPLIED"))
        return plan, diff, change

    def _autoscaled_counts_kept(self, plan: Plan, given: frozenset[str]) -> Plan:
        """`plan` with each group that stays autoscaled running as many replicas as the autoscaler runs now (within
        the new bounds), unless the request sets its count: planning starts it at its minimum, so an apply of the
        same config would restart every worker to take replicas away from a group the autoscaler had grown."""
        from stagevisor.supervisor.placement.planner import rescale

        for group in plan.groups:
            running = next((g for g in self.host.plan.groups if g.name == group.name), None)
            if group.autoscale is None or running is None or running.autoscale is None or group.name in given:
                continue
            count = min(max(running.replicas, group.autoscale.min_replicas), group.autoscale.max_replicas)
            if count != group.replicas:
                plan = rescale(plan, group.name, count)
        return plan

    async def _apply(
        self, plan: Plan, dry_run: bool, counts_given: frozenset[str] | None, attempt: _Attempt
    ) -> tuple[Plan, TopologyDiff]:
        host = self.host
        attempt.task = asyncio.current_task()
        try:
            if counts_given is not None:
                # Under the change lock: a scale (the autoscaler's) this apply waited for has set the count it keeps.
                plan = self._autoscaled_counts_kept(plan, counts_given)
            diff = topology_diff(host.plan, plan)
            if not diff.changed:
                return plan, diff
            check_switchable(host.plan, plan, launcher=host.options.launcher, state=host.state, runners=host.runners)
        except (StagevisorError, DaemonError) as error:
            if not dry_run:  # a dry run answers what the apply would: refused the same way, but nothing counted
                self._refused(error)
            raise
        if dry_run:
            return plan, diff
        try:
            switch = asyncio.ensure_future(self._switch(plan, diff, attempt))
            self._starting = attempt.switch = switch
            await asyncio.shield(switch)
        except StoppedAfterSwitch:
            self._count("applied")  # it switched: not a refusal, though the daemon no longer runs either topology
            raise
        except (PlacementError, DaemonError) as error:
            self._refused(error)
            raise
        self._count("applied")
        return plan, diff

    async def abort_starting(self) -> None:
        """An apply still starting its new workers is cancelled: they stop and the apply is refused."""
        switch, self._starting = self._starting, None
        if switch is not None and not switch.done():
            log.info("shutdown: the apply in progress is refused; stopping its new workers")
            switch.cancel()
            await asyncio.gather(switch, return_exceptions=True)

    def retired_in_flight(self) -> int:
        """Requests an apply's old topology still holds while they finish (0 when none drains): a shutdown's drain
        waits for them as for the daemon's own, rather than stop their workers under them."""
        return self._retired.in_flight() if self._retired is not None else 0

    def _count(self, outcome: str) -> None:
        if self.host.metrics is not None:
            self.host.metrics.applies.labels(outcome).inc()

    def _retired_lost(self, gateway: G, worker: str, reason: str) -> None:
        """A worker of the topology an apply replaced died while it drained: its requests fail, and watchers learn
        it (a WARNING: those requests failed, though the new topology serves)."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        gateway.fail_group(worker, reason)
        outcome = (
            f"a worker of the topology an apply replaced was lost while it drained ({reason}): its requests failed"
        )
        self.host.publish(ConditionEvent.now(worker, GroupState.READY, outcome, "WARNING"))

    def _refused(self, error: StagevisorError | DaemonError) -> None:
        """An apply refused (nothing changed): counted, and a WARNING on the event stream for whoever watches it,
        as an applied one is an APPLIED event."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        self._count("refused")
        text = f"{error.code.value}: {error.message}" if isinstance(error, StagevisorError) else str(error)
        if not text.startswith("apply refused"):
            text = f"apply refused: {text}"
        self.host.publish(ConditionEvent.now("", GroupState.READY, text, "WARNING"))

    async def _switch(self, plan: Plan, diff: TopologyDiff, attempt: _Attempt) -> None:
        host = self.host
        run_dir = self._directory(self.generation + 1)
        make_private_dir(run_dir)
        routes, sink = gateway_addresses(plan, run_dir)
        gateway = host.gateway_factory(plan, routes, sink, admission=host.gateway.admission)
        gateway.limits = host.gateway.limits
        if host.metrics is not None:
            gateway.metrics = host.metrics
        specs = host.specs_for(plan, run_dir=run_dir, gateway=gateway)
        failures: list[Failure] = []
        runners: dict[str, WorkerRunner] = {}
        hooks = RunnerHooks(
            on_event=lambda event: _starting_event(event, gateway, runners),
            on_failure=failures.append,
            on_worker_lost=gateway.fail_group,
            not_restarted=lambda: SHUTDOWN if host.state in (DaemonState.STOPPING, DaemonState.STOPPED) else "",
        )
        log.info("apply: starting the new topology beside the running one:\n%s", diff.render())
        try:
            await gateway.start()
            runners.update({name: host.make_runner(spec, hooks) for name, spec in specs.items()})
            for runner in runners.values():
                runner.spawn(reason="apply")
            await asyncio.gather(*(runner.await_ready() for runner in runners.values()))
            if host.state in (DaemonState.STOPPING, DaemonState.STOPPED):
                # A shutdown began and has not cancelled this yet (it awaits the autoscaler first): refused below.
                raise DaemonError("the daemon began stopping")
            # One READY early may have died while the others loaded: switching would retire a topology that serves
            # every group for one that lost a worker before it served, even one its crash recovery has READY again.
            if failures:
                raise WorkerStartError(failures[0].group, failures[0].message)
            down = [runner.name for runner in runners.values() if runner.state is not GroupState.READY]
            if down:
                raise WorkerStartError(down[0], f"new group {down[0]!r} left READY: {runners[down[0]].state.value}")
            self._starting = None  # from here a shutdown stops the new workers as the daemon's own
        except BaseException as error:
            self._starting = None
            await asyncio.gather(*(r.stop("apply refused") for r in runners.values()), return_exceptions=True)
            gateway.retire(host.gateway)  # stopping it must leave the admission queue it shares alone
            await asyncio.gather(gateway.stop(0.0), return_exceptions=True)
            remove_private_tree(run_dir)
            if host.state in (DaemonState.STOPPING, DaemonState.STOPPED):
                raise DaemonError(
                    "apply refused: the daemon began stopping before the new topology was READY; its new workers "
                    "are stopped; nothing changed"
                ) from None
            if attempt.client_gone:
                raise DaemonError(CLIENT_GONE) from None
            if failures:
                cause = failures[0].message
            elif isinstance(error, WorkerStartError):
                cause = error.message
            elif isinstance(error, Exception):
                # A daemon bug (a hook on a new worker's READY, say), not a worker's: the operator gets its class
                # and text, the log its traceback.
                log.exception("apply refused: the daemon failed while starting the new topology")
                cause = f"{type(error).__name__}: {error}; the daemon log has its traceback"
            else:
                cause = type(error).__name__
            raise DaemonError(f"apply refused: the new topology did not start ({cause}); nothing changed") from None
        old_runners, old_gateway, old_hooks, old_dir = dict(host.runners), host.gateway, host.hooks, self.generation_dir
        old_sockets = [*(spec.address for spec in host.specs.values()), host.sink_address]
        # The old ones only finish what they hold: their events are logged, a lost worker fails its own requests
        # and is not restarted (nothing routes to the old topology any more).
        old_hooks.on_event = _retired_event
        old_hooks.on_failure = lambda failure: log.warning("apply: retired worker failed: %s", failure.message)
        old_hooks.on_worker_lost = lambda worker, reason: self._retired_lost(old_gateway, worker, reason)
        old_hooks.not_restarted = lambda: "not restarted: an apply replaced its topology, it only finished what it held"
        self.generation += 1
        # From here the new topology is the daemon's: its runners report as the daemon's own.
        await host.adopt_topology(plan, specs, sink, gateway, runners, hooks)
        old_gateway.retire(gateway)
        log.info("apply: new requests go to the new topology; draining %d in flight", old_gateway.in_flight())
        host.retiring = list(old_runners.values())
        self._retired = old_gateway
        try:
            await self._retire(old_runners, old_gateway, old_dir, old_sockets)
        finally:
            host.retiring = []
            self._retired = None
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        changes = "; ".join(f"{g.kind} {g.name}" for g in diff.groups if g.kind != "kept")
        if host.state in (DaemonState.STOPPING, DaemonState.STOPPED):
            # The shutdown let the old topology's requests finish and stopped both topologies' workers.
            log.info(
                "apply: the new topology had taken over (%s), then the daemon stopped while the old drained", changes
            )
            raise StoppedAfterSwitch(
                f"the new topology took over ({changes}), then the daemon began stopping while the old topology's "
                "requests finished: it no longer runs; start it again with the new placement"
            )
        log.info("apply: done, the daemon runs the new topology (%s)", changes)
        host.publish(ConditionEvent.now("", GroupState.READY, f"applied: {changes}", "APPLIED"))

    async def _retire(self, runners: dict[str, WorkerRunner], gateway: G, run_dir: Path, sockets: list[str]) -> None:
        """Let the old topology finish its requests (up to the drain budget), then stop it."""
        options = self.host.options
        budget = max(options.drain_timeout, options.request_limits.request_timeout or 0.0)
        deadline = time.monotonic() + budget
        while gateway.in_flight() > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if gateway.in_flight():
            log.warning(
                "apply: cancelling %s still on the old topology after %.0f s",
                counted(gateway.in_flight(), "request"),
                budget,
            )
        await asyncio.gather(*(r.stop("replaced by apply") for r in runners.values()), return_exceptions=True)
        await step("stop the old topology's data plane", gateway.stop(1.0))
        if run_dir != self.run_dir:
            remove_private_tree(run_dir)
        else:  # the first topology lives in the run directory itself: only its sockets go
            for address in sockets:
                Path(address.removeprefix("unix:")).unlink(missing_ok=True)


CLIENT_GONE = (
    "apply refused: its client went away (Ctrl-C, or a cancelled Apply call) before the new topology was READY; its "
    "new workers are stopped; nothing changed"
)
"""Why an apply whose client went away before its switch changed nothing."""


class _Attempt:
    """One apply while it runs: its task under the change lock, the task starting its new topology (until it ends),
    and whether its client went away before the switch."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.switch: asyncio.Task[None] | None = None
        self.client_gone = False


class StoppedAfterSwitch(DaemonError):
    """An apply switched to its new topology, then a shutdown began while the old one drained: the change was made
    (counted as applied) but the daemon no longer runs; the operator starts it again with the new placement."""


def _starting_event(event: LifecycleEvent, gateway: SwitchGateway, runners: Mapping[str, WorkerRunner]) -> None:
    """A new topology's worker changed state while it starts: logged, and its text limit declared once READY."""
    if event.new_state is GroupState.READY:
        gateway.declare_text_limit(event.group, runners[event.group].max_text_chars)
    log.info("apply: new group %r: %s -> %s", event.group, event.old_state.value, event.new_state.value)


def _retired_event(event: LifecycleEvent) -> None:
    log.info("apply: retired group %r: %s -> %s", event.group, event.old_state.value, event.new_state.value)
