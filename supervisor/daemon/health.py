"""The daemon's health: SERVING or DEGRADED judged from its workers' reports, and the root cause of the incident now.

Every runner of the topology reports through the daemon's RunnerHooks, which
are DaemonHealth's: a transition (`on_event`), a failure (`on_failure`), a
lost worker (`on_worker_lost`) and heartbeat silence (`on_silence`). From
them it judges the daemon's state, tells admission which groups are down or
FAILED and when to retry, and keeps the failures of the incident now, whose
first is the root cause status reports. The daemon (core.py) owns the state it sets.
"""

from __future__ import annotations

import bisect
import logging
from typing import Mapping, Protocol

from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState, LifecycleEvent
from stagevisor.supervisor.daemon.replicas import ReplicaSets
from stagevisor.supervisor.daemon.runner import Failure, WorkerRunner, transition
from stagevisor.supervisor.dataplane.admission import START_ALLOWANCE, Admission
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import RootCause

log = logging.getLogger("stagevisor.daemon")


class HealthGateway(Protocol):
    """What judging its health asks of the daemon's data-plane gateway."""

    admission: Admission
    """Told which groups are FAILED or down, and when they are expected READY."""

    def fail_group(self, group: str, reason: str) -> None: ...

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        """A group's worker became READY declaring this text limit (None: it declares none)."""


class HealthHost(Protocol):
    """What judging its health needs from the daemon (core.py's Daemon)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> DaemonState: ...

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """Worker name -> its runner, in plan order."""

    @property
    def replicas(self) -> ReplicaSets: ...

    @property
    def gateway(self) -> HealthGateway: ...

    def set_state(self, state: DaemonState) -> None:
        """Move the daemon to `state` (its serving listeners and systemd hear of a change)."""

    def publish(self, event: LifecycleEvent) -> None: ...


class DaemonHealth:
    """How one daemon reads its workers' reports: its state, what admission refuses meanwhile, the root cause."""

    def __init__(self, host: HealthHost) -> None:
        self.host = host
        self.failures: list[Failure] = []
        """The failures of the incident now (or of the last one), in time order."""
        self._healthy_at: float | None = None
        """When every worker last became READY (event clock); None while one is not."""
        self._incident_since = float("-inf")
        """Failures before this belong to an incident every worker has since recovered from."""

    def root_cause(self) -> RootCause | None:
        """The first failure of the incident now, or of the last one (with when it ended) once every worker is
        READY again, until the next begins (track_incident); None when there is none."""
        first = next((f for f in self.failures if f.time >= self._incident_since), None)
        # Every worker READY again ends the incident (_healthy_at): its cause is shown as past until the next.
        return None if first is None else first.root_cause(recovered_at=self._healthy_at)

    def on_event(self, event: LifecycleEvent) -> None:
        if event.new_state is GroupState.READY:
            self.host.gateway.declare_text_limit(event.group, self.host.runners[event.group].max_text_chars)
        log.info("group %r: %s", event.group, transition(event))
        self.host.publish(event)
        self.host.replicas.on_event(event)
        self.track_incident(event.time)
        self.update_state()

    def track_incident(self, now: float) -> None:
        """Start a new incident when a worker goes down after every worker was READY: its first failure is the
        root cause status reports, not one of an earlier incident every group has recovered from."""
        if all(r.state is GroupState.READY for r in self.host.runners.values()):
            if self._healthy_at is None:
                self._healthy_at = now
        elif self._healthy_at is not None:
            self._incident_since, self._healthy_at = self._healthy_at, None
            # What came before can never be a root cause again: a daemon whose workers crash now and then (a
            # stage that kills its worker on some input) keeps the failures of one incident, not of its lifetime.
            del self.failures[: bisect.bisect_left(self.failures, self._incident_since, key=lambda f: f.time)]

    def serving_groups(self) -> set[str]:
        """The process groups that have a READY worker (a replicated group: at least one replica; a group whose
        new worker is down while a restart without a pause drains the old one: that one, which takes its
        requests meanwhile)."""
        ready = {r.spec.group.name for r in self.host.runners.values() if r.state is GroupState.READY}
        return ready | self.host.replicas.served_by_old()

    def answering_groups(self) -> set[str]:
        """The process groups that have a READY worker that answers its heartbeat: `serving_groups` less those
        whose every READY worker is silent (a frozen process, a blocked event loop), which readiness reports."""
        answering = {
            r.spec.group.name for r in self.host.runners.values() if r.state is GroupState.READY and not r.silence
        }
        return answering | self.host.replicas.served_by_old(answering=True)

    def update_state(self) -> None:
        """SERVING while every group has a READY worker that answers its heartbeat (`answering_groups`), so
        readiness goes NOT_SERVING while a group's only worker (or every replica) is silent; admission refuses every
        request while a group has FAILED with none (`_failed_groups`), or has none while it restarts (a crash's
        backoff, `restart --force`), saying when to retry. A silent worker is still READY: its group's requests
        wait for it (it may answer again, or be killed at the heartbeat timeout)."""
        if self.host.state in (DaemonState.SERVING, DaemonState.DEGRADED):
            serving = self.serving_groups()
            all_ready = all(g.name in serving for g in self.host.plan.groups)
            answering = self.answering_groups()
            all_answering = all(g.name in answering for g in self.host.plan.groups)
            self.host.set_state(DaemonState.SERVING if all_answering else DaemonState.DEGRADED)
            failed = self._failed_groups(serving)
            self.host.gateway.admission.failed_groups = failed
            self.host.gateway.admission.down_groups = tuple(
                g.name for g in self.host.plan.groups if g.name not in serving and g.name not in failed
            )
            self._expect_restarts(all_ready)

    def _expect_restarts(self, all_ready: bool) -> None:
        """Tell admission when the groups that are down are expected READY (the Retry-After of the requests that
        fail meanwhile): the last backoff to end plus START_ALLOWANCE. A worker STARTING after its backoff keeps
        the estimate made when it entered BACKOFF."""
        admission = self.host.gateway.admission
        if all_ready:
            admission.expect_restart(None)
            return
        waits = [wait for runner in self.host.runners.values() if (wait := runner.restart_in()) is not None]
        if waits:
            admission.expect_restart(max(waits) + START_ALLOWANCE)

    def _failed_groups(self, serving: set[str]) -> tuple[str, ...]:
        """The process groups not `serving` whose every worker is FAILED: none restarts by itself."""
        workers: dict[str, list[GroupState]] = {}
        for runner in self.host.runners.values():
            workers.setdefault(runner.spec.group.name, []).append(runner.state)
        return tuple(
            group.name
            for group in self.host.plan.groups
            if group.name not in serving
            and workers.get(group.name)
            and all(state is GroupState.FAILED for state in workers[group.name])
        )

    def on_failure(self, failure: Failure) -> None:
        bisect.insort(self.failures, failure, key=lambda f: f.time)

    def on_worker_lost(self, worker: str, reason: str) -> None:
        runner = self.host.runners.get(worker)
        if runner is not None and (self.host.replicas.is_replica(runner) or self.host.replicas.beside_old(runner)):
            # Only what was routed to this replica fails (or to this new worker while the old one it replaced
            # drains beside it, holding requests of its own).
            self.host.replicas.on_lost(runner)
            return
        self.host.gateway.fail_group(worker, reason)

    def on_silence(self, worker: str, reason: str) -> None:
        """A worker missed heartbeats (`reason`) or beats again (""): watchers learn it; a replica leaves the
        rotation meanwhile, unless every replica of its group is silent; the daemon is DEGRADED (readiness
        NOT_SERVING) while a group has no READY worker that answers."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        runner = self.host.runners.get(worker)
        if runner is None:
            return
        replica = self.host.replicas.silence_changed(runner)
        if reason:
            then = (
                "it takes no new requests (another replica does)"
                if replica and runner.spec.group.name in self.answering_groups()
                else "its requests wait for it and readiness is NOT_SERVING"
            )
            outcome = f"{reason}: {then} until it answers; it is killed if silent for the heartbeat timeout"
            log.warning("%s", outcome)
            self.host.publish(ConditionEvent.now(worker, runner.state, outcome, "WARNING", runner.pid or 0))
        else:
            outcome = "answers its heartbeat again" + (": it takes new requests again" if replica else "")
            log.info("worker %r %s", worker, outcome)
            self.host.publish(ConditionEvent.now(worker, runner.state, outcome, "NOTICE", runner.pid or 0))
        self.update_state()
