"""The daemon: start one worker per process group (one per replica) in plan order, watch them, restart, drain and stop.

`Daemon` is the orchestration core, independent of the CLI and of the
servers: it takes a Plan and DaemonOptions (options.py). It owns the running
topology (its runners, gateway and state) and the hooks its runners report
through; each other concept is a module that asks it through a Protocol it
implements: startup.py, replicas.py, restarts.py, live_change.py (apply),
autoscale.py, views.py (the reports), events.py (the watchers),
health.py (its state and root cause, from what its runners report) and
shutdown.py (the shutdown's steps); specs.py says what each worker starts
with, worker_factory.py makes each spec and runner with the daemon's options,
seams.py says what the daemon runs on (its gateway, the factories).
supervisor/service.py wires it to the admin and public servers, signals and
systemd; `stagevisor serve` calls `service.run()`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Generic, Mapping

from stagevisor.supervisor.daemon import systemd, views
from stagevisor.supervisor.daemon.autoscale import DaemonAutoscaling
from stagevisor.supervisor.addresses import runtime_dir
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.errors import ConfigError, DaemonError, ErrorCode
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.daemon.restarts import Restarts
from stagevisor.supervisor.daemon.runner import SHUTDOWN, Failure, WorkerRunner, RunnerHooks
from stagevisor.supervisor.daemon.events import EventFeed
from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.daemon.health import DaemonHealth
from stagevisor.supervisor.daemon.live_change import LiveChange, run_locked
from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState, LifecycleEvent
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.seams import DaemonGateway, GatewayFactory, GatewayT, LauncherFactory
from stagevisor.supervisor.config.voices import VoiceNamesChange
from stagevisor.supervisor.placement.diff import TopologyDiff
from stagevisor.supervisor.placement.request import PlacementRequest
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import RootCause, StatusReport, SummaryReport, TopologyReport
from stagevisor.supervisor.daemon.replicas import ReplicaSets
from stagevisor.supervisor.daemon.runtime_files import make_private_dir
from stagevisor.supervisor.daemon.shutdown import DrainDeadline, shut_down
from stagevisor.supervisor.daemon.startup import StartupError, process_start, start_workers
from stagevisor.supervisor.daemon.specs import gateway_addresses, local_launcher
from stagevisor.supervisor.daemon.worker_factory import WorkerFactory
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")


class Daemon(Generic[GatewayT]):
    """Runs a Plan: one worker process per process group (per replica), supervised until shutdown.

    The composition (service.py) hands it what it runs on: `gateway_factory` makes the data plane's
    gateway, `launcher` makes the launcher that starts workers (default: local_launcher).
    """

    def __init__(
        self,
        plan: Plan,
        options: DaemonOptions | None = None,
        *,
        gateway_factory: GatewayFactory[GatewayT],
        launcher: LauncherFactory[GatewayT] | None = None,
    ) -> None:
        self.plan = plan
        self.gateway_factory = gateway_factory
        """Makes the data plane's gateway: the daemon's, and each apply's new topology's."""
        self.options = options or DaemonOptions()
        self.state = DaemonState.STARTING
        self.pid = os.getpid()
        self.public_address = ""
        """The public endpoint's address as bound (service.start_servers sets it): status reports it."""
        self.http_url = ""
        """The HTTP API's URL as bound (service.run sets it; "" without one): status reports it."""
        self.voice_names: Mapping[str, str] = dict(self.options.voice_names)
        """The config's `voices` map now: a name clients send -> the model's voice (an apply of a config replaces
        it with the config's)."""
        self.run_dir = self.options.run_dir or runtime_dir() / f"d{self.pid}"
        self.changes: LiveChange[GatewayT] = LiveChange(self, self.run_dir)
        """Applies new plans live; its lock serializes them with scales and restarts beside a worker."""
        self.worker_factory = WorkerFactory(self)
        """Makes the WorkerSpecs and WorkerRunners of the daemon's workers, and keeps their alternate addresses."""
        # The gateway first: the specs carry its shared-memory directory (_worker_specs).
        routes, sink = gateway_addresses(plan, self.generation_dir)
        admission = Admission(self.options.admission)
        admission.starting = True  # until every worker is READY (start): refused as starting, with Retry-After
        self.gateway: GatewayT = gateway_factory(plan, routes, sink, admission=admission)
        self.gateway.limits = self.options.request_limits
        self.specs, self.sink_address = self.worker_factory.specs(plan)
        if launcher is None and self.options.launcher != "local":
            raise DaemonError(f"launcher {self.options.launcher!r} is not built in; pass its factory as `launcher`")
        self._launcher: DaemonLauncher = (launcher or local_launcher)(plan, self.specs, self.gateway, self.options)
        self.health = DaemonHealth(self)
        """Judges the daemon's state from what its runners report, and keeps the root cause."""
        self._hooks = RunnerHooks(
            on_event=self.health.on_event,
            on_failure=self.health.on_failure,
            on_worker_lost=self.health.on_worker_lost,
            not_restarted=lambda: SHUTDOWN if self.state in (DaemonState.STOPPING, DaemonState.STOPPED) else "",
            on_silence=self.health.on_silence,
        )
        self._runners = {name: self.make_runner(spec) for name, spec in self.specs.items()}
        """Worker name (the group's, `group/i` for a replica) -> its runner, in plan order."""
        self.replicas = ReplicaSets(self)
        self.restarts = Restarts(self)
        """Operator restarts, and the steps of one without a pause."""
        self.requests: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        """Signals and shutdown requests, consumed by run(): handlers only enqueue."""
        self.drain_deadline = DrainDeadline()
        """When the shutdown's drain ends at the latest: each stop's grace, the shortest winning."""
        self.serving_listeners: list[Callable[[bool], None]] = []
        self.systemd_status = systemd.StatusLine()
        """The STATUS= line systemd hears, each status once."""
        self.events = EventFeed(ended=lambda: self.state is DaemonState.STOPPED)
        """The watchers of `stagevisor events`, and the recent events a new one gets first."""
        self._started = time.monotonic()
        self._shutdown_task: asyncio.Task[None] | None = None
        self.retiring: list[WorkerRunner] = []
        """Runners outside the topology that a shutdown stops too: the old topology's while an apply lets them
        finish their requests; a restart's new worker while it starts, then its old one while it drains."""
        from stagevisor.supervisor.daemon.monitor import Monitor

        self.monitor = Monitor(
            plan,
            self._runners,
            self.publish,
            metrics=self.options.metrics,
            rss_budgets=self.options.rss_budgets,
            interval=self.options.resource_interval,
        )
        self.metrics = self.monitor.metrics
        """DaemonMetrics (its `.registry` is what /metrics serves), None with metrics off."""
        if self.metrics is not None:
            self.gateway.metrics = self.metrics  # worker reports, request meters
            self.metrics.admission = self.gateway.admission
        self.autoscaling = DaemonAutoscaling(self)
        """Runs the autoscaler over the plan's autoscaled groups while the daemon serves; scale_group applies."""
        if self.metrics is None and any(g.autoscale is not None for g in plan.groups):
            raise ConfigError(
                ErrorCode.INVALID_CONFIG,
                "autoscaling reads the daemon's request metrics, which are off; drop --no-metrics or the "
                "`autoscale:` settings of the config's processes",
            )

    def make_runner(self, spec: WorkerSpec, hooks: RunnerHooks | None = None) -> WorkerRunner:
        """A runner of `spec`'s worker, reporting through `hooks` (default: the daemon's)."""
        return self.worker_factory.runner(spec, self._launcher, hooks or self._hooks)

    # -- replicas (supervisor/daemon/replicas.py drives these) ----------------------

    @property
    def generation_dir(self) -> Path:
        """Where the current topology's sockets live: the run directory, then run_dir/g<n> after each apply."""
        return self.changes.generation_dir

    def specs_for(
        self, plan: Plan, *, run_dir: Path | None = None, gateway: DaemonGateway | None = None
    ) -> dict[str, WorkerSpec]:
        """The WorkerSpecs a plan would start, in this daemon's run directory and shared memory; with `run_dir`,
        in that directory for `gateway`'s (an apply's new topology)."""
        return self.worker_factory.specs(plan, run_dir, gateway=gateway)[0]

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name (the group's, `group/i` for a replica) -> its runner, in plan order (read-only)."""
        return self._runners

    @property
    def drain_timeout(self) -> float:
        """How long a replica taken out of rotation (rolling restart, scale-down) may finish its requests: as
        long as a request may run (`replica_drain_timeout`), not only --drain-timeout (that bounds shutdown)."""
        return self.worker_factory.drain_timeout

    def add_runner(self, spec: WorkerSpec) -> WorkerRunner:
        runner = self._runners[spec.name] = self.make_runner(spec)
        return runner

    def remove_runner(self, name: str) -> None:
        self._runners.pop(name, None)
        self.gateway.declare_text_limit(name, None)

    def rename_runner(self, name: str, spec: WorkerSpec) -> None:
        runner = self._runners.pop(name)
        limit = runner.max_text_chars
        self.gateway.declare_text_limit(name, None)
        runner.rename(spec)
        runner.stop_timeout = self.worker_factory.stop_timeout(spec)
        self._runners[spec.name] = runner
        if runner.state is GroupState.READY:
            self.gateway.declare_text_limit(spec.name, limit)

    def adopt_plan(self, plan: Plan, specs: dict[str, WorkerSpec]) -> None:
        """Run `plan` from now on (after a scale): runners in its worker order, the monitor on its workers."""
        self.plan = plan
        self.specs = specs
        ordered = {name: self._runners[name] for name in specs if name in self._runners}
        self._runners.clear()  # the same dict: the monitor holds it
        self._runners.update(ordered)
        self.monitor.adopt_plan(plan)
        self._launcher.adopt(specs)
        self.health.track_incident(time.time())  # a removed replica may have been the last worker not READY
        self.health.update_state()
        self._tell_systemd_workers()

    # A restart without a pause (restarts.py): ReplicaSets.replace_worker runs its steps through the daemon.

    def beside_runner(self, name: str) -> WorkerRunner:
        return self.restarts.beside_runner(name)

    def swap_runner(self, old: WorkerRunner, new: WorkerRunner) -> None:
        self.restarts.swap_runner(old, new)

    def retire_runner(self, runner: WorkerRunner, outcome: str, *, warning: bool = False) -> None:
        self.restarts.retire_runner(runner, outcome, warning=warning)

    def spec_beside(self, name: str) -> WorkerSpec:
        """The spec of a new worker of the single-worker group `name` at the address its worker does not use."""
        return self.worker_factory.spec_beside(self.plan, name)

    def take_worker(self, name: str, new: WorkerRunner) -> None:
        """`new` (READY, at the address the group's worker did not use) is the worker of single-worker group
        `name` from now on: its transitions are the group's."""
        self._runners[name] = new  # the same dict: the monitor holds it
        self.specs[name] = new.spec
        self.worker_factory.alternate ^= {name}
        new.hooks = self._hooks  # the group's worker now: its transitions are the group's
        self.gateway.declare_text_limit(name, new.max_text_chars)  # its stages may declare another limit

    def change_lock(self) -> asyncio.Lock:
        """Held while an apply, a scale or a restart beside a worker changes the topology (LiveChange.lock)."""
        return self.changes.lock()

    async def scale_group(self, name: str, replicas: int, *, operator: bool = True) -> tuple[int, int, list[str]]:
        """Run `replicas` workers of a group; PlacementError when the plan's rules refuse it (nothing changes).

        `operator`: an operator's `stagevisor scale`, which watchers hear of as a SCALED event once it changed the
        count (the autoscaler publishes its own AUTOSCALE event instead)."""
        self._check_scalable(name)
        return await run_locked(self.changes.lock(), lambda: self._scale(name, replicas, operator))

    async def _scale(self, name: str, replicas: int, operator: bool) -> tuple[int, int, list[str]]:
        self._check_scalable(name)  # again: a stop may have begun while an apply or another scale ran
        old, new, workers = await self.replicas.scale(name, replicas)
        if operator and new != old:
            from stagevisor.supervisor.daemon.monitor import ConditionEvent

            named = ", ".join(f"{worker} pid {self._runners[worker].pid or '-'}" for worker in workers)
            text = f"from {old} to {counted(new, 'replica')} by an operator: {named}"
            self.publish(ConditionEvent.now(name, self.replicas.group_state(name), text, "SCALED"))
        return old, new, workers

    def _check_scalable(self, name: str) -> None:
        if self.state not in (DaemonState.SERVING, DaemonState.DEGRADED):
            raise DaemonError(
                f"cannot scale group {name!r} while the daemon is {self.state.value}{self.state.refusal_advice()}"
            )

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Spawn every group's worker in plan order and wait until all are READY.

        Raises StartupError with every failure, first first, after stopping
        every worker already started.
        """
        make_private_dir(self.run_dir)
        await self.gateway.start()
        self.monitor.start()
        await self._launcher.prepare()  # off the event loop: a fork server's preload, a cluster joined
        runners = list(self._runners.values())
        await start_workers(runners, self.health.on_failure)
        if self.failures:
            for failure in self.failures:
                self._runners[failure.group].fail_startup(failure.message)
            await asyncio.gather(*(r.stop("startup failed") for r in runners))
            self.set_state(DaemonState.STOPPED)
            raise StartupError(list(self.failures))
        self.set_state(DaemonState.SERVING)
        self.gateway.admission.starting = False
        counted_groups = self._counted_groups()
        self.systemd_status.tell(f"STATUS=serving {counted_groups}", "READY=1")
        log.info("READY: %s, %.1fs after serve started", counted_groups, time.time() - process_start())
        self.autoscaling.start()

    def _counted_groups(self) -> str:
        """`1 process group`, `2 process groups (3 workers)`: what the daemon serves, for its READY line and
        systemd's STATUS."""
        groups = len(self.plan.groups)
        text = counted(groups, "process group")
        if len(self._runners) != groups:  # replicas (or tensor-parallel ranks): a worker process each
            text += f" ({counted(len(self._runners), 'worker')})"
        return text

    def group_names(self) -> list[str]:
        """The workers in plan order (a group's name, `group/i` per replica), then the replicated groups."""
        # By runner, not by the plan's count: a scale from one worker renames it `group/0` before the plan
        # says the group has replicas, and the group keeps its name meanwhile.
        replicated = [g.name for g in self.plan.groups if g.name not in self._runners]
        return [*self._runners, *replicated]

    def group_state(self, name: str) -> GroupState:
        """A worker's lifecycle state, or a replicated group's (see ReplicaSets.group_state); KeyError if unknown."""
        if name in self._runners:
            return self._runners[name].state
        return self.replicas.group_state(name)

    async def restart_group(self, name: str, *, force: bool = False) -> tuple[int, int]:
        """Replace one worker (Restarts.restart): without a pause when it serves, one replica at a time."""
        return await self.restarts.restart(name, force=force)

    def restarted_state(self, name: str, pid: int) -> GroupState:
        """The state of the worker a restart of `name` started as `pid` (a rolling restart: its last replica's):
        that worker's, though a scale that ran right after renamed it (`name` -> `name/0`) or added replicas not
        READY yet. When no worker has that pid (it died since and its recovery runs), `group_state(name)`:
        KeyError if an apply retired the group meanwhile."""
        restarted = next((r for r in self._runners.values() if pid and r.pid == pid), None)
        return restarted.state if restarted is not None else self.group_state(name)

    # -- live topology changes (live_change.py drives these) -----------------------

    async def apply_plan(self, plan: Plan, *, dry_run: bool = False) -> TopologyDiff:
        """Move the running daemon to `plan` without failing a request, or refuse and change nothing
        (LiveChange.apply): PlacementError or DaemonError when refused."""
        return await self.changes.apply(plan, dry_run=dry_run)

    async def apply_request(
        self, request: PlacementRequest, *, dry_run: bool = False
    ) -> tuple[Plan, TopologyDiff, VoiceNamesChange | None]:
        """`apply_plan` of `request`'s plan under the `plan` rules (a request they refuse is an apply refused too),
        and its config's `voices` map with it."""
        return await self.changes.apply_request(request, dry_run=dry_run)

    @property
    def launcher(self) -> DaemonLauncher:
        """What starts, signals and stops the workers (the launcher factory's, local_launcher by default)."""
        return self._launcher

    @property
    def hooks(self) -> RunnerHooks:
        """How the topology's runners report to the daemon (an apply's new topology brings its own)."""
        return self._hooks

    async def adopt_topology(
        self,
        plan: Plan,
        specs: dict[str, WorkerSpec],
        sink: str,
        gateway: GatewayT,
        runners: dict[str, WorkerRunner],
        hooks: RunnerHooks,
    ) -> None:
        """Run an apply's new topology (every worker READY) from now on: its runners report through `hooks` as
        the daemon's own, its gateway takes the requests, and no group runs at its alternate address."""
        hooks.on_event, hooks.on_failure = self.health.on_event, self.health.on_failure
        hooks.on_worker_lost, hooks.on_silence = self.health.on_worker_lost, self.health.on_silence
        self.worker_factory.alternate = set()
        self._hooks = hooks
        self.gateway = gateway
        self.plan, self.specs, self.sink_address = plan, specs, sink
        self._runners.clear()  # the same dict: the monitor holds it
        self._runners.update(runners)
        if self.metrics is not None:
            self.metrics.stage_groups = {s.name: plan.group_of(s.name).name for s in plan.stages}
        self.monitor.adopt_plan(plan)
        self._launcher.adopt(specs)
        self.replicas = ReplicaSets(self)
        await self.replicas.announce()
        self.health.track_incident(time.time())  # every worker is READY: an incident of the old topology is over
        self.health.update_state()
        self._tell_systemd_workers()
        self.autoscaling.restart()

    def request_shutdown(self, grace: float | None = None) -> float:
        """Ask run() to shut down (or, while it drains, to end the drain within `grace` if that is sooner); return
        an upper bound on how long that takes, in seconds."""
        self.requests.put_nowait(("shutdown", grace))
        return self._drain_budget(grace) + self.options.stop_timeout + 5.0

    def shorten_drain(self, grace: float | None) -> None:
        """A later stop while the shutdown drains: its grace ends the drain sooner, never later."""
        self.drain_deadline.within(self._drain_budget(grace))

    def _drain_budget(self, grace: float | None) -> float:
        return self.options.drain_timeout if grace is None else max(0.0, grace)

    async def shutdown(self, grace: float | None = None) -> None:
        """Drain in-flight requests, stop every worker, remove sockets. Idempotent; concurrent calls share one run."""
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.create_task(self._shutdown(grace))
        await asyncio.shield(self._shutdown_task)

    async def _shutdown(self, grace: float | None) -> None:
        await shut_down(self, self._drain_budget(grace))

    # -- reports (views.py builds them) ------------------------------------------

    def topology(self) -> TopologyReport:
        """The plan (`stagevisor plan --format json`) plus runtime fields per group, edge and GPU."""
        return views.topology(self)

    def status(self) -> StatusReport:
        return views.status(self)

    def metrics_summary(self) -> SummaryReport:
        """Per group and stage what `stagevisor top` shows."""
        return views.summary(self)

    def voices(self) -> list[dict[str, Any]]:
        """The voices the executors declared in their READY handshakes, each once, in plan order."""
        return views.voices(self._runners)

    @property
    def uptime(self) -> float:
        """Seconds since the daemon started."""
        return time.monotonic() - self._started

    def root_cause(self) -> RootCause | None:
        """The first failure of the incident now, or of the last one (with when it ended) once every worker is
        READY again, until the next begins (DaemonHealth.root_cause); None when there is none."""
        return self.health.root_cause()

    @property
    def serving(self) -> bool:
        return self.state is DaemonState.SERVING

    # -- watchers (events.py) -----------------------------------------------

    def subscribe(self, history: bool = False) -> asyncio.Queue[LifecycleEvent | None]:
        """A queue of LifecycleEvents from now on (with `history`, the recent ones first); None marks the end."""
        return self.events.subscribe(history)

    def unsubscribe(self, queue: asyncio.Queue[LifecycleEvent | None]) -> None:
        self.events.unsubscribe(queue)

    def publish(self, event: LifecycleEvent) -> None:
        """Send an event (a LifecycleEvent or a monitor's ConditionEvent) to every watcher."""
        self.events.publish(event)

    # -- health (health.py judges it from what the runners report) -----------------

    @property
    def failures(self) -> list[Failure]:
        """The failures of the incident now (or of the last one), in time order."""
        return self.health.failures

    def refresh_state(self) -> None:
        """Judge SERVING or DEGRADED again: a worker outside the topology that serves a group changed state."""
        self.health.update_state()

    def serving_groups(self) -> set[str]:
        """The process groups that have a READY worker (DaemonHealth.serving_groups)."""
        return self.health.serving_groups()

    def set_state(self, state: DaemonState) -> None:
        if state is self.state:
            return
        was, was_serving = self.state, self.serving
        self.state = state
        if was_serving != self.serving:
            for listener in self.serving_listeners:
                listener(self.serving)
            if state is DaemonState.DEGRADED:
                self.systemd_status.tell("STATUS=degraded: a process group has no READY worker that answers")
            elif state is DaemonState.SERVING and was is DaemonState.DEGRADED:
                # Only a recovery: the first SERVING of `start` goes out with READY=1, in one datagram.
                self.systemd_status.tell(f"STATUS=serving {self._counted_groups()}")

    def _tell_systemd_workers(self) -> None:
        """A scale or an apply changed the groups or workers served: a SERVING daemon's STATUS counts them again."""
        if self.state is DaemonState.SERVING:
            self.systemd_status.tell(f"STATUS=serving {self._counted_groups()}")
