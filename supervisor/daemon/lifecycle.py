"""Group lifecycle: the guarded state machine of one process group and its restart backoff policy.

Pure: no processes, no clocks of its own (callers pass `now`), so it is
unit-tested with fakes. The daemon drives it; the admin API reports it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable


class GroupState(str, enum.Enum):
    """The state of one process group's worker.

    Transitions (anything else raises IllegalTransition):

    - STOPPED  -> STARTING   the daemon or an operator starts a worker
    - STARTING -> READY      the worker built its stages and answered the handshake
    - STARTING -> BACKOFF    a restarted worker failed to start; another try is allowed
    - STARTING -> FAILED     a worker failed to start and no try is left (or at daemon startup)
    - STARTING -> STOPPING   shutdown or operator restart while a worker initializes
    - READY    -> BACKOFF    the worker died; it will be restarted after a delay
    - READY    -> FAILED     the worker died and the restart limit is reached
    - READY    -> STOPPING   shutdown or operator restart
    - BACKOFF  -> STARTING   the backoff delay elapsed
    - BACKOFF  -> STOPPING   shutdown or operator restart during the delay
    - STOPPING -> STOPPED    the worker exited (after TERM, or KILL past the stop timeout)
    - FAILED   -> STARTING   an operator restarts a failed group
    - FAILED   -> STOPPING   shutdown of a daemon with a failed group (nothing to stop)
    """

    STOPPED = "STOPPED"
    STARTING = "STARTING"
    READY = "READY"
    BACKOFF = "BACKOFF"
    STOPPING = "STOPPING"
    FAILED = "FAILED"


S = GroupState
TRANSITIONS: frozenset[tuple[GroupState, GroupState]] = frozenset(
    {
        (S.STOPPED, S.STARTING),
        (S.STARTING, S.READY),
        (S.STARTING, S.BACKOFF),
        (S.STARTING, S.FAILED),
        (S.STARTING, S.STOPPING),
        (S.READY, S.BACKOFF),
        (S.READY, S.FAILED),
        (S.READY, S.STOPPING),
        (S.BACKOFF, S.STARTING),
        (S.BACKOFF, S.STOPPING),
        (S.STOPPING, S.STOPPED),
        (S.FAILED, S.STARTING),
        (S.FAILED, S.STOPPING),
    }
)


class DaemonState(str, enum.Enum):
    """The daemon as a whole: STARTING -> SERVING <-> DEGRADED -> STOPPING -> STOPPED.

    DEGRADED means at least one group has no READY worker that answers its heartbeat after
    startup (restarting or FAILED, or its only READY workers silent; the old worker of a
    restart without a pause counts while it drains); health reports NOT_SERVING then.
    """

    STARTING = "STARTING"
    SERVING = "SERVING"
    DEGRADED = "DEGRADED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"

    def refusal_advice(self) -> str:
        """What an operator refused a change (restart, scale) in this state can do, as a clause to append."""
        if self is DaemonState.STARTING:
            return "; retry once `stagevisor status` says SERVING"
        if self in (DaemonState.STOPPING, DaemonState.STOPPED):
            return "; it is shutting down: start a daemon again (`stagevisor serve`) to serve"
        return ""


class IllegalTransition(RuntimeError):
    """A bug in the daemon: a transition the state machine does not allow. Not recoverable."""


@dataclass(frozen=True)
class LifecycleEvent:
    """One transition, as streamed by the admin API's WatchEvents."""

    group: str
    old_state: GroupState
    new_state: GroupState
    pid: int
    reason: str
    time: float
    kind: str = ""
    """"" for a transition; a condition beside the transitions (daemon/monitor.py) says WARNING or NOTICE."""


@dataclass
class GroupLifecycle:
    """The state, pid and restart count of one group, changed only through guarded transitions."""

    group: str
    listener: Callable[[LifecycleEvent], None] = lambda event: None
    clock: Callable[[], float] = time.time
    state: GroupState = GroupState.STOPPED
    pid: int = 0
    restarts: int = 0
    started_at: float | None = None
    """Wall-clock time the current worker became READY; None when not READY."""

    def transition(
        self,
        new: GroupState,
        *,
        leaving: tuple[GroupState, ...] | None = None,
        pid: int | None = None,
        reason: str = "",
    ) -> LifecycleEvent:
        """Move to `new`, asserting the state left is allowed (and among `leaving` when given)."""
        old = self.state
        if (old, new) not in TRANSITIONS or (leaving is not None and old not in leaving):
            raise IllegalTransition(f"group {self.group!r}: {old.value} -> {new.value} is not allowed")
        self.state = new
        if pid is not None:
            self.pid = pid
        now = self.clock()
        if new is GroupState.READY:
            self.started_at = now
        elif new in (GroupState.STOPPED, GroupState.FAILED, GroupState.BACKOFF):
            self.started_at = None
            self.pid = 0
        event = LifecycleEvent(self.group, old, new, pid if pid is not None else self.pid, reason, now)
        self.listener(event)
        return event


@dataclass(frozen=True)
class RestartDecision:
    """What to do after a worker died: restart after `delay` seconds, or give up (FAILED)."""

    restart: bool
    delay: float
    attempt: int
    """1 for the first restart of a run of consecutive crashes."""


CRASH_LOOP_AFTER = 3
"""Consecutive crashes from which a group is reported as crash-looping (its BACKOFF reason says so)."""


@dataclass
class BackoffPolicy:
    """Exponential restart backoff, capped, retried for as long as the group keeps crashing (like Kubernetes'
    CrashLoopBackOff) unless `max_restarts` sets a limit.

    A worker that stayed READY for `stable_after` seconds resets the count, so
    a group that crashes once a day starts again from `initial`. The delay
    before try n is `initial * factor**(n-1)`, capped at `max_delay`: a group
    that crash-loops is retried every `max_delay` seconds and is READY again
    within about that long after its cause goes away. With `max_restarts` set,
    the try after that many consecutive crashes is not made: FAILED, until an
    operator restarts the group.
    """

    max_restarts: int | None = None
    initial: float = 0.5
    factor: float = 2.0
    max_delay: float = 10.0
    stable_after: float = 30.0
    _consecutive: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_restarts is not None and self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0 (or None: no limit), got {self.max_restarts}")
        if self.initial < 0 or self.factor < 1 or self.max_delay < 0:
            raise ValueError("backoff needs initial >= 0, factor >= 1, max_delay >= 0")

    @property
    def consecutive(self) -> int:
        """Crashes since the worker was last stable (READY for `stable_after` seconds)."""
        return self._consecutive

    def after_exit(self, *, ready_for: float | None) -> RestartDecision:
        """Decide after a worker exit; `ready_for` is how long it was READY (None: never)."""
        if ready_for is not None and ready_for >= self.stable_after:
            self._consecutive = 0
        self._consecutive += 1
        attempt = self._consecutive
        if self.max_restarts is not None and attempt > self.max_restarts:
            return RestartDecision(False, 0.0, attempt)
        delay = min(self.max_delay, self.initial * self.factor ** min(attempt - 1, 64))
        return RestartDecision(True, delay, attempt)

    def describe(self, decision: RestartDecision) -> str:
        """`restart 3/5 in 2.00s`, or `restart 7 in 10.00s (crash loop: retried every 10s)` without a limit."""
        limit = f"/{self.max_restarts}" if self.max_restarts is not None else ""
        text = f"restart {decision.attempt}{limit} in {decision.delay:.2f}s"
        if decision.attempt >= CRASH_LOOP_AFTER:
            text += f" (crash loop: {decision.attempt} crashes in a row; backoff capped at {self.max_delay:g}s)"
        return text

    def reset(self) -> None:
        """Forget past crashes (an operator restarted the group by hand)."""
        self._consecutive = 0
