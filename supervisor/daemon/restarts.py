"""Operator restarts (`stagevisor restart`): one worker replaced, without a pause when it serves, one at a time.

A READY single worker is replaced without a pause: a new worker starts at the group's other address
(`beside_runner`), takes the group's requests once READY (`swap_runner`), and the old one finishes what it holds
before it stops (`retire_runner`); ReplicaSets.replace_worker runs those steps, and gives the group's requests back
to the old worker should the new one die while the old one drains. A FAILED or restarting group, or
one restarted with --force, is stopped first instead; a replicated group's replicas restart one at a time. A
restart of a group whose restart runs shares it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Mapping, Protocol

from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState, LifecycleEvent
from stagevisor.supervisor.daemon.live_change import run_locked
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.replicas import ReplicaSets
from stagevisor.supervisor.daemon.runner import RunnerHooks, WorkerRunner, transition
from stagevisor.supervisor.errors import DaemonError, PlacementError
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")


class RestartHost(Protocol):
    """What an operator restart needs from its daemon (core.py's Daemon)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> DaemonState: ...

    @property
    def options(self) -> DaemonOptions: ...

    @property
    def replicas(self) -> ReplicaSets: ...

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name -> its runner, in plan order."""

    @property
    def hooks(self) -> RunnerHooks:
        """How the topology's runners report to the daemon."""

    @property
    def retiring(self) -> list[WorkerRunner]:
        """Runners outside the topology that a shutdown stops too."""

    def change_lock(self) -> asyncio.Lock:
        """Held while an apply or a scale changes the topology."""

    def spec_beside(self, name: str) -> WorkerSpec:
        """The spec of a new worker of single-worker group `name` at the address its worker does not use."""

    def make_runner(self, spec: WorkerSpec, hooks: RunnerHooks) -> WorkerRunner: ...

    def take_worker(self, name: str, new: WorkerRunner) -> None:
        """`new` (READY) is the worker of single-worker group `name` from now on."""

    def publish(self, event: LifecycleEvent) -> None: ...

    def refresh_state(self) -> None:
        """Judge SERVING or DEGRADED again (a restart's old worker, outside the topology, changed state)."""


class Restarts:
    """The operator restarts of one daemon, and the runners a restart without a pause keeps outside its topology."""

    def __init__(self, host: RestartHost) -> None:
        self.host = host
        self._restarting: dict[str, asyncio.Task[tuple[int, int]]] = {}
        """Single-worker group -> its restart while one runs, with or without a pause: any other restart of the
        group meanwhile, forced or not, shares it (one new worker; never one restart's worker replaced by the
        other's)."""
        self._cuts: dict[str, asyncio.Event] = {}
        """Single-worker group -> set by a `--force` restart that meets its restart without a pause: the old
        worker stops as soon as the new one serves, without finishing its requests."""

    async def restart(self, name: str, *, force: bool = False) -> tuple[int, int]:
        """Replace one worker; a replicated group's one replica at a time. KeyError when unknown, DaemonError
        while stopping.

        A READY single worker is replaced without a pause (`ReplicaSets.replace_worker`): PlacementError when
        its GPU cannot hold a second copy, DaemonError with --launcher ray; nothing changes then. `force`
        stops it first instead, as a FAILED or restarting group always is: requests in flight there fail.
        A restart of a group whose restart runs (either kind) shares that one and returns its pids; with `force`
        it cuts a restart without a pause short: the old worker stops once the new one serves, without
        finishing its requests.
        """
        try:
            runner = self._check_restartable(name)
        except KeyError:
            lock = self.host.change_lock()
            if not lock.locked():
                raise
            # An apply or a scale runs and may add this group: known, if at all, once it ends.
            async with lock:
                pass
            runner = self._check_restartable(name)
        log.info("restarting %s %r on operator request", "replica" if "/" in name else "group", name)
        restarting = self._restarting.get(name)
        if restarting is not None and not restarting.done():
            cut = self._cuts.get(name)
            if force and cut is not None and not cut.is_set():
                log.warning("restart of %r: --force cuts the running restart's drain short", name)
                cut.set()
            return await asyncio.shield(restarting)  # two operators, one new worker
        # Shielded: a client that disconnects mid-restart must not leave the group half-started.
        if runner is not None and not self.host.replicas.is_replica(runner):
            # A restart that stops the worker first is registered too: the group reads READY until the stop
            # begins, and a restart without a pause started meanwhile would replace its new worker once READY.
            if force or runner.state is not GroupState.READY:
                self._restarting[name] = task = asyncio.ensure_future(self._restart_worker(name, None))
            else:
                self._check_beside(name)
                self._restarting[name] = task = asyncio.ensure_future(self._restart_worker(name, self._cut(name)))
            return await asyncio.shield(task)
        # Replicas one at a time: not while an apply or a scale changes the set (an apply retires them all,
        # then the next replica by this name would be one of the new topology's).
        return await run_locked(self.host.change_lock(), lambda: self._restart_replicas(name, force))

    async def _restart_replicas(self, name: str, force: bool) -> tuple[int, int]:
        """A rolling restart of replicated group `name`, or the restart of its replica `name`; of its single
        worker when an apply or a scale that ran first left the group one (as `restart` would have)."""
        runner = self._check_restartable(name)
        if runner is None:
            return await self.host.replicas.restart_group(name)
        if self.host.replicas.is_replica(runner):
            return await self.host.replicas.restart_replica(name)
        # Registered as `restart` registers a single worker's: a restart of the group meanwhile shares this one.
        task = asyncio.current_task()
        assert task is not None
        self._restarting[name] = task
        cut = None if force else self._cut(name)
        try:
            return await self._restart_runner(name, runner, cut)
        finally:
            self._forget_cut(name, cut)

    def _cut(self, name: str) -> asyncio.Event:
        """The cut of a restart without a pause of single-worker group `name`, held until the restart ends."""
        self._cuts[name] = cut = asyncio.Event()
        return cut

    async def _restart_worker(self, name: str, cut: asyncio.Event | None) -> tuple[int, int]:
        """A single worker's restart, after an apply or a scale that runs (which may have changed the group): it
        restarts the group the daemon runs then and reports that group's pids, not those of a worker the apply
        has since stopped."""
        try:
            async with self.host.change_lock():
                runner = self._check_restartable(name)
                if runner is None:  # a scale gave it replicas meanwhile
                    return await self.host.replicas.restart_group(name)
                return await self._restart_runner(name, runner, cut)
        finally:
            self._forget_cut(name, cut)

    async def _restart_runner(self, name: str, runner: WorkerRunner, cut: asyncio.Event | None) -> tuple[int, int]:
        """Restart the single worker `runner` of group `name`: without a pause with `cut` (set, it stops the old
        worker without finishing its requests), else (`--force`) stopping it first, as a worker not READY always
        is (nothing to drain)."""
        if cut is None or runner.state is not GroupState.READY:
            return await runner.restart()
        self._check_beside(name)
        return await self.host.replicas.replace_worker(name, cut=cut)

    def _forget_cut(self, name: str, cut: asyncio.Event | None) -> None:
        """A restart without a pause ended: its cut goes, unless a later restart of the group holds one already."""
        if cut is not None and self._cuts.get(name) is cut:
            del self._cuts[name]

    def _check_beside(self, name: str) -> None:
        """Whether a second worker of `name` may run beside it: PlacementError or DaemonError, each with --force."""
        from stagevisor.supervisor.placement.diff import check_restart_surge

        try:
            check_restart_surge(self.host.plan, name)
        except PlacementError as refusal:
            raise refusal.adding(self.host.replicas.cpu_advice(name)) from None
        if self.host.options.launcher != "local":
            raise DaemonError(
                f"restarting group {name!r} without a pause needs the local launcher (as apply does); "
                f"`stagevisor restart {name} --force` stops the worker first (its requests in flight fail)"
            )

    def _check_restartable(self, name: str) -> WorkerRunner | None:
        """The worker called `name` (None for a replicated group); KeyError when unknown, DaemonError when the
        daemon is not serving."""
        runner = self.host.runners.get(name)
        if runner is None and not self.host.replicas.runners_of(name):
            raise KeyError(name)
        state = self.host.state
        if state in (DaemonState.STOPPING, DaemonState.STOPPED, DaemonState.STARTING):
            raise DaemonError(
                f"cannot restart group {name!r} while the daemon is {state.value}{state.refusal_advice()}"
            )
        return runner

    # -- the steps of a restart without a pause (ReplicaSets.replace_worker runs them) ----------

    def beside_runner(self, name: str) -> WorkerRunner:
        """A runner for a new worker of the single-worker group `name`, at the address its worker does not use:
        not the group's yet (`swap_runner`); a shutdown stops it meanwhile."""
        host = self.host
        # Until the swap the group is its old worker's, READY and serving: the new one's transitions go to the
        # log only (watchers get the restart's outcome as a notice), and losing it fails no request (it holds
        # none), where the daemon's hooks would publish it as the group's and fail the old worker's requests.
        runner = host.make_runner(
            host.spec_beside(name),
            RunnerHooks(
                on_event=lambda event: log.info("restart: new worker of group %r: %s", event.group, transition(event)),
                on_failure=host.hooks.on_failure,
                on_worker_lost=lambda _worker, _reason: None,
                not_restarted=host.hooks.not_restarted,
            ),
        )
        host.retiring.append(runner)
        return runner

    def swap_runner(self, old: WorkerRunner, new: WorkerRunner) -> None:
        """`new` (READY) is the group's worker from now on; `old` only finishes what it holds: its transitions
        are logged, not published, a loss fails only the requests sent to it, and it is not restarted."""
        host = self.host
        # The count goes on from the old worker's now, not when `new` was made: the old one may have restarted
        # (crashed, recovered) while `new` loaded.
        new.follow(old)
        host.retiring.remove(new)
        host.retiring.append(old)
        host.take_worker(old.name, new)

        def on_old_event(event: LifecycleEvent) -> None:
            log.info("restart: old worker of group %r: %s", event.group, transition(event))
            host.refresh_state()  # it may be what serves the group: its new worker can die while it drains

        old.hooks = RunnerHooks(
            on_event=on_old_event,
            on_failure=lambda failure: log.warning("restart: old worker failed: %s", failure.message),
            on_worker_lost=lambda _worker, reason: self._old_lost(old, reason),
            # Dying while it drains, it ends STOPPED: the group has its new worker, and a restart here would
            # start one nothing needs (then stop it when the drain ends).
            not_restarted=lambda: "not restarted: a new worker replaced it, it only finished what it held",
        )

    def _old_lost(self, old: WorkerRunner, reason: str) -> None:
        """A restart's old worker died while it drained: the requests sent to it fail, and watchers learn it (a
        WARNING: those requests failed, though the restart itself goes on with the new worker)."""
        self.host.replicas.on_lost(old)
        outcome = f"the old worker, draining after a restart, was lost ({reason}): the requests it held failed"
        self._condition(old.name, outcome, "WARNING")

    def retire_runner(self, runner: WorkerRunner, outcome: str, *, warning: bool = False) -> None:
        """A runner `beside_runner` or `swap_runner` left outside the topology has stopped: its socket goes, and
        watchers learn `outcome` (a NOTICE when the restart is done, a WARNING with `warning`: it was refused,
        or its new worker died while the old one drained and was not READY again in time)."""
        if runner in self.host.retiring:
            self.host.retiring.remove(runner)
        Path(runner.spec.address.removeprefix("unix:")).unlink(missing_ok=True)
        self._condition(runner.name, outcome, "WARNING" if warning else "NOTICE")

    def _condition(self, name: str, outcome: str, kind: str) -> None:
        """Tell watchers `outcome` about worker `name`, with the state and pid of the worker that has the name now."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        current = self.host.runners.get(name)
        state = current.state if current is not None else GroupState.STOPPED
        pid = (current.pid or 0) if current is not None else 0
        self.host.publish(ConditionEvent.now(name, state, outcome, kind, pid))
