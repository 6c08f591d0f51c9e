"""The daemon's replicas of process groups: which take requests, draining, rolling restarts and live scaling.

A replicated group runs one WorkerRunner per replica (`group/i`). Every
sender (the gateway, each worker) picks a replica per request among those
this module announces as taking requests: READY and not being drained. The
announcement (a Replicas frame, supervisor/dataplane/replicas.py) goes out
whenever a replica changes state; before a replica is stopped on purpose, the
daemon waits until every worker has taken it in, then until the requests
sent to it have ended (the worker itself drains what it holds on SIGTERM).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Mapping, Protocol, Sequence

from stagevisor.supervisor.errors import PlacementError, StoppedWhileStarting, WorkerStartError
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.daemon.runner import WorkerRunner
from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent
from stagevisor.supervisor.placement.planner import rescale
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")
ACK_TIMEOUT = 5.0
"""How long a drain waits for every worker to take a replica out of its rotation."""


REPLICA_DRAIN_SLACK = 5.0
"""Seconds a replica's drain adds to --request-timeout: a request ended at its deadline still reports it."""


def replica_drain_timeout(drain_timeout: float, request_timeout: float) -> float:
    """How long a rolling restart or a scale-down waits for a replica's requests: as long as a request may
    legitimately run (--request-timeout, plus REPLICA_DRAIN_SLACK), and never less than --drain-timeout.
    A request that could still finish is never cut; the wait ends as soon as the replica holds none."""
    return max(drain_timeout, request_timeout + REPLICA_DRAIN_SLACK)


class ReplicaGateway(Protocol):
    """What ReplicaSets asks of the data plane's gateway: announce the rotation, hear it taken in, count requests."""

    def push_replicas(
        self,
        sets: Mapping[str, tuple[str, ...]],
        lost: tuple[str, ...],
        workers: Mapping[str, str],
        names: Mapping[str, str] | None = None,
    ) -> int: ...

    async def wait_replicas(self, version: int, workers: Mapping[str, str], timeout: float) -> list[str]: ...

    def replica_in_flight(self, replica: str) -> int: ...

    def request_ids(self) -> frozenset[str]:
        """The requests in flight now, whatever worker holds them."""


class ReplicaHost(Protocol):
    """What ReplicaSets needs from its daemon (supervisor/daemon/core.py's Daemon)."""

    plan: Plan

    @property
    def gateway(self) -> ReplicaGateway: ...

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name -> its runner, in plan order."""

    @property
    def drain_timeout(self) -> float:
        """Seconds a replica taken out of rotation has to finish the requests sent to it."""

    def specs_for(self, plan: Plan) -> dict[str, WorkerSpec]: ...

    def add_runner(self, spec: WorkerSpec) -> WorkerRunner: ...

    def remove_runner(self, name: str) -> None: ...

    def rename_runner(self, name: str, spec: WorkerSpec) -> None: ...

    def adopt_plan(self, plan: Plan, specs: dict[str, WorkerSpec]) -> None: ...

    def beside_runner(self, name: str) -> WorkerRunner:
        """A runner for a new worker of single-worker group `name` at its other address, not the group's yet."""

    def swap_runner(self, old: WorkerRunner, new: WorkerRunner) -> None:
        """`new` is the group's worker from now on; `old` only finishes what it holds."""

    def retire_runner(self, runner: WorkerRunner, outcome: str, *, warning: bool = False) -> None:
        """A runner outside the topology stopped; watchers learn `outcome` (a WARNING with `warning`)."""


def _new_worker_down(new: WorkerRunner, old: WorkerRunner, old_pid: int, waited: float) -> str:
    """Why a restart without a pause failed: its new worker died after the switch and was not READY again by the
    end of the old worker's drain (`waited` seconds)."""
    down = f"the new worker died after the switch and is {new.state.value}, not READY, {waited:.0f} s later"
    if old.state is GroupState.READY:
        return f"{down}; the old worker pid {old_pid} is stopped anyway (requests still on it fail)"
    return f"{down}; the old worker pid {old_pid}, which took the group's requests meanwhile, is {old.state.value} too"


def cpu_host_advice(workers: str, whose: str, stages: Sequence[str], planned: str) -> str:
    """What a refusal for want of GPU fractions adds where the `workers` it is about run on CPU here (no CUDA
    device): `gpu: null` on `stages` plans them on CPU, where no fraction applies. One wording for every such
    refusal (restart, scale, apply); `whose` leads the stages' names, `planned` says what they become. Pure."""
    return (
        f" ({workers} run on CPU here, with no CUDA device, where no fraction applies: `gpu: null` on {whose} "
        f"{', '.join(map(repr, stages))} in a config, e.g. `stages: [{{name: {stages[0]}, gpu: null}}]`, "
        f"plans {planned} with no GPU budget)"
    )


class ReplicaSets:
    """Replica bookkeeping of one Daemon; the daemon calls in on lifecycle events and operator requests."""

    def __init__(self, daemon: ReplicaHost) -> None:
        self.daemon = daemon
        self.replicated: set[str] = {g.name for g in daemon.plan.groups if g.replicas > 1}
        """Groups that run, or ran, more than one replica: their routing is announced."""
        self.draining: set[str] = set()
        """Replicas (worker names) READY but taken out of rotation before they stop."""
        self.replaced: dict[str, WorkerRunner] = {}
        """Single-worker group -> its old worker while a restart without a pause drains it: the group's
        requests go to it again whenever the new worker is not READY (`_taking`)."""
        self._lock: asyncio.Lock | None = None

    # ---- who is who -------------------------------------------------------------

    def runners_of(self, group: str) -> list[WorkerRunner]:
        """The group's runners in replica order (one for a single worker)."""
        return [r for r in self.daemon.runners.values() if r.spec.group.name == group]

    def cpu_advice(self, group: str) -> str:
        """For a GPU group's restart or scale its fractions refuse: when every worker of the group runs on CPU here
        (no CUDA device), how to plan it as the CPU group it is. "" otherwise."""
        runners = self.runners_of(group)
        if not runners or any(runner.device != "cpu" for runner in runners):
            return ""
        plan = self.daemon.plan
        stages = [s.name for s in plan.stages if s.name in plan.group(group).stages and s.gpu is not None]
        if not stages:
            return ""
        return cpu_host_advice(
            "its workers", "its stages", stages, "it as a CPU group, which restarts beside itself and scales"
        )

    def is_replica(self, runner: WorkerRunner) -> bool:
        return runner.spec.worker != ""

    def group_state(self, group: str) -> GroupState:
        """READY when every replica is; else the state of the first that is not."""
        runners = self.runners_of(group)
        if not runners:
            raise KeyError(group)
        return next((r.state for r in runners if r.state is not GroupState.READY), GroupState.READY)

    def missing(self) -> list[str]:
        """Replicas out of the rotation (not READY, draining, or silent while another answers): what `status`
        lists as missing."""
        taking = {address for addresses in self._sets().values() for address in addresses}
        return [r.name for r in self.daemon.runners.values() if self.is_replica(r) and r.spec.address not in taking]

    # ---- announcing -------------------------------------------------------------

    def _sets(self) -> dict[str, tuple[str, ...]]:
        sets = {}
        for group in sorted(self.replicated):
            runners = self.runners_of(group)
            if runners:
                sets[group_address(runners[0].spec)] = self._taking(group, runners)
        return sets

    def _taking(self, group: str, runners: list[WorkerRunner]) -> tuple[str, ...]:
        """The addresses of the group's workers that take new requests: READY, not draining and not silent (if
        all of those are silent, those rather than none). With none, the old worker a restart without a pause
        still drains, if READY: the new one died or restarts meanwhile, and an empty set would send every
        request to the group's address, whichever worker that is. Failing that, the READY replicas a scale down
        drains: the one it keeps is down meanwhile, and they serve until it is back rather than refuse."""
        ready = [r for r in runners if r.state is GroupState.READY and r.name not in self.draining]
        # A silent replica (missed heartbeats, not yet killed) gets no new requests while another answers.
        taking = tuple(r.spec.address for r in ([r for r in ready if not r.silence] or ready))
        if taking:
            return taking
        old = self.replaced.get(group)
        if old is not None and old.state is GroupState.READY:
            return (old.spec.address,)
        return tuple(r.spec.address for r in runners if r.state is GroupState.READY and r.name in self.draining)

    def _targets(self) -> dict[str, str]:
        # Keyed by the name each worker answers with: a scale renames a running worker (`vocoder` <->
        # `vocoder/0`) without restarting it, and it keeps acknowledging under the name it started with.
        return {r.worker_name: r.spec.address for r in self.daemon.runners.values() if r.state is GroupState.READY}

    def push(self, lost: tuple[str, ...] = ()) -> int:
        """Tell the gateway and every READY worker which replicas take requests (and which died)."""
        if not self.replicated:
            return 0
        # Each READY worker's name now, by the one it started under: one a scale renamed retitles itself.
        names = {r.worker_name: r.name for r in self.daemon.runners.values() if r.state is GroupState.READY}
        pushed: int = self.daemon.gateway.push_replicas(self._sets(), lost, self._targets(), names)
        return pushed

    async def announce(self) -> None:
        """Tell the gateway and every READY worker which replicas take requests, and wait for their acknowledgement."""
        await self._push_and_wait()

    async def _push_and_wait(self) -> None:
        targets = self._targets()
        version = self.push()
        missing = await self.daemon.gateway.wait_replicas(version, targets, ACK_TIMEOUT)
        if missing:
            log.warning(
                "workers %s did not confirm the replica change within %gs; going on", ", ".join(missing), ACK_TIMEOUT
            )

    def on_event(self, event: LifecycleEvent) -> None:
        runner = self.daemon.runners.get(event.group)
        if runner is None or runner.spec.group.name not in self.replicated:
            if event.new_state is GroupState.READY and self.replicated:
                self.push()  # a restarted worker of another group learns the current replicas
            return
        if event.new_state is GroupState.READY:
            self.draining.discard(runner.name)  # a fresh worker
        if event.new_state is GroupState.READY or event.old_state is GroupState.READY:
            self.push()

    def silence_changed(self, runner: WorkerRunner) -> bool:
        """`runner`'s worker went silent or beats again: a replica's group announces who takes requests now.
        Whether it is a replica (of a replicated group)."""
        if runner.spec.group.name not in self.replicated:
            return False
        self.push()
        return True

    def on_lost(self, runner: WorkerRunner) -> None:
        """A replica's worker died: senders fail what they routed to it and route around it."""
        self.push(lost=(runner.spec.address,))

    def served_by_old(self, answering: bool = False) -> set[str]:
        """Groups whose old worker, READY while a restart without a pause drains it, serves them: should the new
        worker be down, it takes their requests (`_taking`). `answering`: only where it is not silent."""
        return {
            group
            for group, old in self.replaced.items()
            if old.state is GroupState.READY and not (answering and old.silence)
        }

    def beside_old(self, runner: WorkerRunner) -> bool:
        """Whether `runner` is a group's new worker while its old one drains beside it (a restart without a
        pause): losing it fails only what was sent to it (`on_lost`), as a replica's loss does, not the
        requests the old worker holds."""
        return runner.spec.group.name in self.replaced and not self.is_replica(runner)

    # ---- draining, restarts -------------------------------------------------------

    async def drain(self, runner: WorkerRunner) -> None:
        """Take a replica out of rotation and wait for the gateway's requests on it, for the host's drain_timeout
        (the daemon's: as long as a request may run, `replica_drain_timeout`).

        The worker drains the requests it holds itself once it gets SIGTERM.
        """
        self.draining.add(runner.name)
        await self._push_and_wait()
        left = self.daemon.gateway.replica_in_flight(runner.spec.address)
        log.info(
            "replica %r out of rotation: waiting up to %.0f s for the %s the daemon sent it",
            runner.name,
            self.daemon.drain_timeout,
            counted(left, "request"),
        )
        deadline = time.monotonic() + self.daemon.drain_timeout
        while left > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            left = self.daemon.gateway.replica_in_flight(runner.spec.address)

    async def restart_replica(self, name: str) -> tuple[int, int]:
        """Drain one replica, then replace its worker; returns once the new one is READY.

        Waits for a scale or rolling restart of its group to end first: KeyError when a scale-down
        removed the replica meanwhile (restarting it would start a worker no runner supervises).
        """
        async with self._guard():
            return await self._restart_replica(name)

    async def _restart_replica(self, name: str) -> tuple[int, int]:
        runner = self.daemon.runners[name]
        if runner.state is GroupState.READY:
            await self.drain(runner)
        try:
            return await runner.restart()
        finally:
            self.draining.discard(name)

    async def restart_group(self, group: str) -> tuple[int, int]:
        """A rolling restart: one replica at a time, each after the one before is READY again.

        Returns (first old pid, last new pid).
        """
        async with self._guard():
            first_old, last_new = 0, 0
            for runner in self.runners_of(group):
                old, new = await self._restart_replica(runner.name)
                first_old = first_old or old
                last_new = new
            return first_old, last_new

    async def replace_worker(self, name: str, *, cut: asyncio.Event | None = None) -> tuple[int, int]:
        """Restart a READY single worker without a pause: start a new one beside it, send new requests to the new
        one once READY, let the old one finish the requests it holds (up to the host's drain_timeout), then stop
        it. Returns (old pid, new pid). WorkerStartError when the new worker does not start (the old one serves
        on), or when it dies after the switch and is not READY again by the end of the drain (the old one stops
        anyway, and the group follows its crash recovery).

        From here the group's routing is announced like a replicated group's (its address maps to its worker's):
        the worker moves between two addresses, one per restart. Should the new worker leave READY while the
        old one drains, the old one takes the group's requests again until it is back (`_drain_replaced`).
        `cut`, once set (a `--force` restart meanwhile), ends the old worker's drain: its requests fail.
        """
        cut = cut or asyncio.Event()
        daemon = self.daemon
        async with self._guard():
            old = daemon.runners[name]
            old_pid = old.pid or 0
            self.replicated.add(old.spec.group.name)
            # The group's first announcement: senders pin the requests that already reached the old worker.
            await self._push_and_wait()
            new = daemon.beside_runner(name)
            try:
                new.spawn(reason=f"restart requested by operator: beside pid {old_pid}, which serves meanwhile")
                await new.await_ready()
            except BaseException as error:
                await new.stop("restart refused")
                why = error.message if isinstance(error, WorkerStartError) else f"{type(error).__name__}: {error}"
                outcome = f"restart refused: the new worker did not start ({why})" + (
                    "" if isinstance(error, StoppedWhileStarting) else f"; pid {old_pid} serves on"
                )
                daemon.retire_runner(new, outcome, warning=True)
                if isinstance(error, Exception):  # INTERNAL for the operator, with the stage that failed
                    raise WorkerStartError(
                        name,
                        f"the new worker did not start beside pid {old_pid}: {why}",
                        stage=error.stage if isinstance(error, WorkerStartError) else "",
                        traceback=error.traceback if isinstance(error, WorkerStartError) else "",
                        advice=error.advice
                        if isinstance(error, StoppedWhileStarting)
                        else f"pid {old_pid} serves on unchanged",
                    ) from None
                raise
            # No await since READY: the new worker is the group's before its own watch runs. From the switch on,
            # the old worker is the group's fallback: should the new one leave READY, the group's requests go
            # back to it (`_taking`), whichever address each worker uses.
            group = old.spec.group.name
            self.replaced[group] = old
            try:
                daemon.swap_runner(old, new)
                await self._push_and_wait()
                left, waited = await self._drain_replaced(name, old, new, cut)
                # Not READY by the end of the drain (both may be down: the old one died too, or a shutdown).
                failed = new.state is not GroupState.READY
                new_pid = new.pid or 0  # READY unless failed: the pid the reply names
                if failed:
                    outcome = _new_worker_down(new, old, old_pid, waited)
                    log.warning("restart of %r without a pause failed: %s", name, outcome)
                elif left and cut.is_set():
                    log.warning(
                        "restart of %r: --force: the old worker stops with %s in flight", name, counted(left, "request")
                    )
                elif left:
                    log.warning(
                        "restart of %r: %s still in flight after %.0f s", name, counted(left, "request"), waited
                    )
                await old.stop(f"replaced by pid {new_pid}")
            finally:
                del self.replaced[group]
                if new.state is not GroupState.READY:
                    self.push()  # the old worker no longer takes the group's requests
            if failed:
                daemon.retire_runner(old, f"restart without a pause failed: {outcome}", warning=True)
                # INTERNAL for the operator: the group is not serving, whatever pid the crash recovery has now.
                raise WorkerStartError(
                    name, outcome, advice="its crash recovery goes on: `stagevisor events` shows when it is READY"
                )
            forced = (
                f" (--force stopped the old one with {counted(left, 'request')} in flight)"
                if cut.is_set() and left
                else ""
            )
            daemon.retire_runner(old, f"restarted without a pause: pid {old_pid} -> {new_pid}{forced}")
            log.info("group %r restarted without a pause: pid %d -> %d", name, old_pid, new_pid)
            return old_pid, new_pid

    async def _drain_replaced(
        self, name: str, old: WorkerRunner, new: WorkerRunner, cut: asyncio.Event
    ) -> tuple[int, float]:
        """Wait until the requests `old` may hold have ended, after a restart without a pause switched its group
        to `new`; returns (how many are left, seconds waited).

        Those are the requests in flight once every sender took the switch in, for up to the host's
        drain_timeout. Should `new` leave READY meanwhile (it died; the crash recovery restarts it), the old
        worker takes the group's requests again (`_taking`) until `new` is READY again, and from then on
        waits for what is in flight then, up to drain_timeout more; never longer than twice drain_timeout in
        all. It stops waiting when `new` is not READY by then, or `old` no longer is (it died, or a shutdown
        stopped both), or once `cut` is set and `new` is READY.
        """
        gateway = self.daemon.gateway
        timeout = self.daemon.drain_timeout
        began = time.monotonic()
        deadline = began + timeout
        # Once every sender took the switch in, only requests in flight now can be on the old worker.
        held = gateway.request_ids()
        restarts = new.restarts
        while time.monotonic() < deadline:
            # By its restart count too: a worker that died and was READY again between two polls.
            if new.state is not GroupState.READY or new.restarts != restarts:
                log.info("restart of %r: the new worker left READY; the old one takes the group's requests", name)
                if not await self._until_ready(new, old, deadline):
                    break
                await self._push_and_wait()
                # Once every sender routes to the new worker again, the old one can hold only requests in
                # flight now.
                held, restarts = gateway.request_ids(), new.restarts
                deadline = min(began + 2 * timeout, time.monotonic() + timeout)
                log.info("restart of %r: the new worker is READY again (pid %s); the old one drains", name, new.pid)
            elif cut.is_set():
                break
            elif held & gateway.request_ids():
                await asyncio.sleep(0.02)
            else:
                break
        return len(held & gateway.request_ids()), min(time.monotonic(), deadline) - began

    async def _until_ready(self, new: WorkerRunner, old: WorkerRunner, deadline: float) -> bool:
        """Wait until `new` is READY (True), or `old` is not (it serves no more) or `deadline` (time.monotonic)
        passes (False)."""
        while new.state is not GroupState.READY:
            if old.state is not GroupState.READY or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    # ---- scaling ----------------------------------------------------------------

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def scale(self, group: str, replicas: int) -> tuple[int, int, list[str]]:
        """Run `replicas` workers of `group`: judged by `rescale` (PlacementError, nothing changes), then applied.

        New replicas are routable once READY; removed ones (highest index first)
        are drained, then stopped. Returns (old count, new count, worker names).
        """
        daemon = self.daemon
        async with self._guard():
            try:
                plan = rescale(daemon.plan, group, replicas)
            except PlacementError as refusal:
                raise refusal.adding(self.cpu_advice(group)) from None
            old = daemon.plan.group(group).replicas
            specs = daemon.specs_for(plan)
            if replicas > old:
                await self._add(group, old, replicas, specs)
            elif replicas < old:
                await self._remove(group, old, replicas, specs)
            daemon.adopt_plan(plan, specs)
            self.push()
            names = [r.name for r in self.runners_of(group)]
            log.info("group %r scaled from %d to %s: %s", group, old, counted(replicas, "replica"), ", ".join(names))
            return old, replicas, names

    async def _add(self, group: str, old: int, new: int, specs: dict[str, WorkerSpec]) -> None:
        daemon = self.daemon
        self.replicated.add(group)
        if old == 1:
            daemon.rename_runner(group, specs[f"{group}/0"])
        added = []
        try:
            for index in range(old, new):
                runner = daemon.add_runner(specs[f"{group}/{index}"])
                added.append(runner)
                runner.spawn(reason=f"scale {group} to {new}")
            await asyncio.gather(*(r.await_ready() for r in added))
        except BaseException:
            await asyncio.gather(*(r.stop("scale failed") for r in added), return_exceptions=True)
            for runner in added:
                daemon.remove_runner(runner.name)
            if old == 1:
                daemon.rename_runner(f"{group}/0", specs_single(daemon, group))
            raise

    async def _remove(self, group: str, old: int, new: int, specs: dict[str, WorkerSpec]) -> None:
        daemon = self.daemon
        for index in reversed(range(new, old)):
            runner = daemon.runners[f"{group}/{index}"]
            if runner.state is GroupState.READY:
                await self.drain(runner)
            await runner.stop(f"scale {group} to {new}")
            daemon.remove_runner(runner.name)
            self.draining.discard(runner.name)
        if new == 1:
            daemon.rename_runner(f"{group}/0", specs[group])


def group_address(spec: WorkerSpec) -> str:
    """The address senders route a worker's group by (its first worker's, unless a restart moved that one)."""
    return spec.routes[spec.group.stages[0]]


def specs_single(daemon: ReplicaHost, group: str) -> WorkerSpec:
    """The spec of a group's single worker under the daemon's current plan."""
    return daemon.specs_for(daemon.plan)[group]
