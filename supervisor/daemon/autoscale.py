"""Autoscaling: a pure policy per group (hysteresis, cooldowns) and the loop that applies it through `scale`.

The policy sees three signals the daemon already measures: the p90 time to
first audio and the p90 playback stall of the requests that finished in the
group's window, and the requests the group's stages hold per replica. Any
signal over its target adds one replica (after the scale-up cooldown); one
replica is removed only once every signal has stayed under
`scale_down_ratio` of its target for the scale-down cooldown. Between the two
thresholds nothing changes, so the count does not flap. Every change goes
through the same `scale` the CLI uses, so the GPU and TP checks are the same.

DaemonAutoscaling is the daemon's side: it runs the Autoscaler over the plan's
autoscaled groups, reads the signals from the daemon's metrics, and reports
each decision (a log line, an AUTOSCALE event, a counter).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from stagevisor.supervisor.errors import StagevisorError
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.plan import Autoscale, Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent
    from stagevisor.supervisor.daemon.monitor import Monitor
    from stagevisor.supervisor.daemon.replicas import ReplicaSets
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

log = logging.getLogger(__name__)
daemon_log = logging.getLogger("stagevisor.daemon")
"""DaemonAutoscaling's: what the daemon decided is in the daemon's log (each line names its logger)."""

INTERVAL_SECONDS = 1.0
"""How often each autoscaled group's signals are read."""


@dataclass(frozen=True)
class Signals:
    """One reading of a group: its replicas now, the requests its stages hold, and the window's p90s."""

    replicas: int
    in_flight: int
    requests: int
    first_audio_p90: float | None
    stall_p90: float | None

    @property
    def in_flight_per_replica(self) -> float:
        return self.in_flight / max(1, self.replicas)


@dataclass(frozen=True)
class Decision:
    """Run `replicas` workers of the group, because of `reason` (an operator reads it in the event)."""

    replicas: int
    reason: str


def _seconds(value: float) -> str:
    return f"{value:.3f} s"


class Policy:
    """The decisions for one group. Pure: time comes in as `now`; `changed(now)` records an applied change, and a
    count it reads that it did not set (an operator's scale) counts as one."""

    def __init__(self, rule: Autoscale) -> None:
        self.rule = rule
        self.last_change = -math.inf
        self.low_since: float | None = None
        self.replicas: int | None = None
        """The count the policy last read or set: another count read means someone else changed it."""

    def decide(self, now: float, signals: Signals) -> Decision | None:
        rule = self.rule
        if self.replicas is not None and signals.replicas != self.replicas:
            self.changed(now)  # an operator's `stagevisor scale`: its cooldowns run from it, as from our own
        self.replicas = signals.replicas
        if signals.replicas < rule.min_replicas:
            return Decision(rule.min_replicas, f"{counted(signals.replicas, 'replica')} is below min_replicas")
        if signals.replicas > rule.max_replicas:
            return Decision(rule.max_replicas, f"{counted(signals.replicas, 'replica')} is above max_replicas")
        over = self.over(signals)
        if over:
            self.low_since = None
            if signals.replicas < rule.max_replicas and now - self.last_change >= rule.scale_up_cooldown_seconds:
                return Decision(signals.replicas + 1, "; ".join(over))
            return None
        if not self.low(signals):
            self.low_since = None
            return None
        if self.low_since is None:
            self.low_since = now
        quiet = min(now - self.low_since, now - self.last_change)
        if signals.replicas > rule.min_replicas and quiet >= rule.scale_down_cooldown_seconds:
            return Decision(
                signals.replicas - 1,
                f"every signal under {rule.scale_down_ratio:g} of its target for {quiet:.0f} s "
                f"({signals.in_flight_per_replica:.2f} requests per replica)",
            )
        return None

    def changed(self, now: float, replicas: int | None = None) -> None:
        """A change was made (`replicas`: the count it set) or refused, at `now`."""
        self.last_change = now
        self.low_since = None
        if replicas is not None:
            self.replicas = replicas

    def over(self, signals: Signals) -> list[str]:
        """Each signal above its target, in words."""
        rule = self.rule
        found = []
        if signals.first_audio_p90 is not None and signals.first_audio_p90 > rule.target_first_audio_p90_seconds:
            found.append(
                f"first audio p90 {_seconds(signals.first_audio_p90)} over its target "
                f"{_seconds(rule.target_first_audio_p90_seconds)}"
            )
        stall_target = rule.target_stall_p90_seconds
        if stall_target is not None and signals.stall_p90 is not None and signals.stall_p90 > stall_target:
            found.append(f"playback stall p90 {_seconds(signals.stall_p90)} over its target {_seconds(stall_target)}")
        if signals.in_flight_per_replica > rule.max_in_flight_per_replica:
            found.append(
                f"{signals.in_flight_per_replica:.2f} requests per replica over "
                f"max_in_flight_per_replica {rule.max_in_flight_per_replica:g}"
            )
        return found

    def low(self, signals: Signals) -> bool:
        """Every signal under `scale_down_ratio` of its target (a signal with no request counts as low)."""
        rule = self.rule
        ratio = rule.scale_down_ratio
        audio_low = (
            signals.first_audio_p90 is None or signals.first_audio_p90 < ratio * rule.target_first_audio_p90_seconds
        )
        stall_target = rule.target_stall_p90_seconds
        stall_low = stall_target is None or signals.stall_p90 is None or signals.stall_p90 <= ratio * stall_target
        busy_low = signals.in_flight_per_replica < ratio * rule.max_in_flight_per_replica
        return audio_low and stall_low and busy_low


class AutoscaleHost(Protocol):
    """What the autoscaler needs from the daemon."""

    def autoscale_signals(self, group: str, window: float) -> Signals: ...

    async def scale_group(self, name: str, replicas: int) -> tuple[int, int, list[str]]: ...

    def autoscale_report(self, group: str, old: int, new: int, reason: str, applied: bool) -> None: ...


class Autoscaler:
    """Reads every autoscaled group's signals each interval and applies its policy's decisions, one at a time."""

    def __init__(
        self,
        rules: Mapping[str, Autoscale],
        host: AutoscaleHost,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = INTERVAL_SECONDS,
    ) -> None:
        self.policies = {group: Policy(rule) for group, rule in rules.items()}
        self.host = host
        self.clock = clock
        self.interval = interval

    async def run(self) -> None:
        """Until cancelled (the daemon cancels it when it stops)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()

    async def tick(self) -> None:
        for group, policy in self.policies.items():
            signals = self.host.autoscale_signals(group, policy.rule.window_seconds)
            decision = policy.decide(self.clock(), signals)
            if decision is None:
                continue
            try:
                await self.host.scale_group(group, decision.replicas)
            except StagevisorError as error:
                # A refusal holds the count where it is; the cooldown keeps it from being retried every second.
                policy.changed(self.clock())
                self.host.autoscale_report(group, signals.replicas, decision.replicas, error.message, False)
                continue
            except Exception as error:  # noqa: BLE001 - a worker that fails to start must not stop autoscaling
                policy.changed(self.clock())
                log.warning("autoscaling %r to %s failed", group, counted(decision.replicas, "replica"), exc_info=True)
                self.host.autoscale_report(group, signals.replicas, decision.replicas, f"failed: {error}", False)
                continue
            policy.changed(self.clock(), decision.replicas)
            self.host.autoscale_report(group, signals.replicas, decision.replicas, decision.reason, True)


class AutoscaledDaemon(Protocol):
    """What a daemon's autoscaling reads and reports through (core.py's Daemon)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def metrics(self) -> DaemonMetrics | None: ...

    @property
    def monitor(self) -> Monitor:
        """Its workers' pids, by which the metrics count the requests each stage holds."""

    @property
    def replicas(self) -> ReplicaSets: ...

    def group_state(self, name: str) -> GroupState: ...

    async def scale_group(self, name: str, replicas: int, *, operator: bool = True) -> tuple[int, int, list[str]]: ...

    def publish(self, event: LifecycleEvent) -> None: ...


class DaemonAutoscaling:
    """A daemon's autoscaling (an AutoscaleHost): the Autoscaler over its plan's autoscaled groups while it
    serves, fed from its metrics, scaling through its `scale_group`."""

    def __init__(self, daemon: AutoscaledDaemon) -> None:
        self.daemon = daemon
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        rules = {g.name: g.autoscale for g in self.daemon.plan.groups if g.autoscale is not None}
        if rules:
            self._task = asyncio.create_task(Autoscaler(rules, self).run(), name="autoscaler")
            daemon_log.info(
                "autoscaling %s", ", ".join(f"{g} ({r.min_replicas}-{r.max_replicas})" for g, r in rules.items())
            )

    def restart(self) -> None:
        """After an apply: the new plan's autoscaled groups, with fresh policies."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # a scale it is applying is shielded (scale_group) and finishes or rolls back
            await asyncio.gather(task, return_exceptions=True)

    def autoscale_signals(self, group: str, window: float) -> Signals:
        """A group's replicas, the requests it holds, and the first-audio and stall p90s of the window.

        The requests it holds are its busiest stage's calls in flight: a request that streams through a group's
        stages is in all of them at once, so their sum counted it once a stage (three requests in the default
        voice's one group read as nine)."""
        metrics = self.daemon.metrics
        assert metrics is not None  # checked when the daemon was made
        pids = self.daemon.monitor.pids()
        current = self.daemon.plan.group(group)
        in_flight = max((metrics.stage_in_flight(stage, pids) for stage in current.stages), default=0)
        figures = metrics.recent.figures(time.monotonic(), window)
        return Signals(current.replicas, in_flight, figures.requests, figures.first_audio_p90, figures.stall_p90)

    async def scale_group(self, name: str, replicas: int) -> tuple[int, int, list[str]]:
        return await self.daemon.scale_group(name, replicas, operator=False)  # its own AUTOSCALE event says it

    def autoscale_report(self, group: str, old: int, new: int, reason: str, applied: bool) -> None:
        """An autoscaling decision: a log line, an AUTOSCALE event and the decisions counter."""
        from stagevisor.supervisor.daemon.monitor import ConditionEvent

        daemon = self.daemon
        if applied:
            text = f"autoscaled {group!r} from {old} to {counted(new, 'replica')}: {reason}"
            direction = "up" if new > old else "down"
        else:
            text = f"autoscaling {group!r} from {old} to {counted(new, 'replica')} was not applied: {reason}"
            direction = "refused"
        daemon_log.info("%s", text)
        if daemon.metrics is not None:
            daemon.metrics.autoscale_decisions.labels(group, direction).inc()
        state = (
            daemon.replicas.group_state(group) if daemon.plan.group(group).replicas > 1 else daemon.group_state(group)
        )
        daemon.publish(ConditionEvent.now(group, state, text, "AUTOSCALE"))
