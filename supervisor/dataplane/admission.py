"""Admission control: how many synthesis requests run at once, how many wait, and for how long.

A leaf module (stdlib only) shared by the gRPC Synthesis servicer and the
HTTP API through `Gateway.submit`: a request is admitted, queued or rejected
here before any frame reaches a worker, so a rejected request never touches
one. Rejections carry the status the transports map (RESOURCE_EXHAUSTED ->
HTTP 429 with Retry-After; UNAVAILABLE -> HTTP 503) and a retry hint.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from stagevisor.supervisor.numbers import counted

DEFAULT_MAX_CONCURRENT = 32
DEFAULT_MAX_QUEUED = 128
DEFAULT_QUEUE_TIMEOUT = 30.0
MAX_RETRY_AFTER = 60
"""Longest Retry-After hint, in seconds: past that the estimate says nothing useful."""
START_ALLOWANCE = 1.0
"""Seconds a restarted worker is taken to need, after its backoff, to be READY again (DESIGN 8: within 1 s)."""
RESTART_RETRY_AFTER = 2
"""Retry-After of a request that failed because a worker on its route went down, before the daemon has a restart
of it scheduled (the request saw the link break before the daemon saw the worker exit): the first restart's
backoff (0.5 s, DaemonOptions.backoff_initial) plus START_ALLOWANCE, rounded up."""


@dataclass(frozen=True)
class AdmissionLimits:
    """`--max-concurrent-requests` (0: unbounded), `--max-queued-requests` (0: no waiting, reject at once),
    `--queue-timeout` in seconds (0: a queued request waits as long as it takes)."""

    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    max_queued: int = DEFAULT_MAX_QUEUED
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("max_concurrent", "max_queued"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = {'unbounded' if name == 'max_concurrent' else 'no queue'})")
        if not (self.queue_timeout >= 0 and math.isfinite(self.queue_timeout)):
            raise ValueError("queue_timeout must be a finite number of seconds >= 0 (0 = no limit)")


class AdmissionRejected(Exception):
    """A request was not admitted; no worker saw it.

    `status` is a grpc.StatusCode name: RESOURCE_EXHAUSTED (busy, or waited
    past the queue timeout: retry after `retry_after` seconds) or UNAVAILABLE
    (the daemon is draining for shutdown: retry on another replica; still
    starting: retry in a few seconds; or a process group FAILED, which serves
    again only once an operator restarts it: `retry_after` is None; or a group
    has no worker taking requests while it restarts: retry after `retry_after`).
    `reason` is BUSY, QUEUE_TIMEOUT, DRAINING, STARTING, GROUP_FAILED or GROUP_DOWN.
    """

    def __init__(self, status: str, reason: str, message: str, retry_after: int | None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


class Slot:
    """One admitted request's place; `release()` (idempotent) frees it for the next waiter."""

    def __init__(self, admission: "Admission", started: float) -> None:
        self._admission = admission
        self._started = started
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release(self)


class Admission:
    """Counts running requests and keeps a FIFO of waiters; rejects the excess at once.

    Only ever used on the daemon's event loop (no locks needed).
    """

    def __init__(self, limits: AdmissionLimits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or AdmissionLimits()
        self._clock = clock
        self.running = 0
        self._waiters: deque[asyncio.Future] = deque()
        self.draining = False
        self.starting = False
        """Set by the daemon until its workers are all READY: a request now would find no worker listening."""
        self.failed_groups: tuple[str, ...] = ()
        """Set by the daemon: the process groups FAILED with no worker serving them (their restarts ran out), which
        every request would reach and none can pass until an operator restarts them."""
        self.down_groups: tuple[str, ...] = ()
        """Set by the daemon: the process groups with no worker taking requests that are coming back by themselves (a
        crashed worker in its backoff, or starting again; one stopped by `restart --force`): every request would
        reach one, so new ones are refused at once, with when to retry, until it is READY again."""
        self._restart_due: float | None = None
        """When, on this clock, the groups that are down are expected READY again (expect_restart); None: unknown."""
        self.rejected = {
            "BUSY": 0,
            "QUEUE_TIMEOUT": 0,
            "DRAINING": 0,
            "STARTING": 0,
            "GROUP_FAILED": 0,
            "GROUP_DOWN": 0,
        }
        self._mean_service = 1.0  # seconds, moving average of admitted requests' time in the pipeline

    @property
    def queued(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    def _has_room(self) -> bool:
        return self.limits.max_concurrent == 0 or self.running < self.limits.max_concurrent

    def retry_after(self) -> int:
        """Whole seconds until a slot is likely free: queue ahead of a newcomer times mean service time."""
        slots = self.limits.max_concurrent or 1
        estimate = self._mean_service * (self.queued + 1) / slots
        return int(min(MAX_RETRY_AFTER, max(1, math.ceil(estimate))))

    def expect_restart(self, seconds: float | None) -> None:
        """Set by the daemon: the process groups that are down are expected READY in `seconds` (their backoff left
        plus START_ALLOWANCE); None: none is down, or when is not known."""
        self._restart_due = None if seconds is None else self._clock() + seconds

    def retry_after_unavailable(self) -> int:
        """Whole seconds a request that failed UNAVAILABLE (a worker on its route went down) should wait before it
        retries: until the groups that are down are expected READY again; RESTART_RETRY_AFTER when that is not
        known (no restart scheduled yet)."""
        if self._restart_due is None:
            return RESTART_RETRY_AFTER
        return int(min(MAX_RETRY_AFTER, max(1, math.ceil(self._restart_due - self._clock()))))

    def reject(self, reason: str) -> AdmissionRejected:
        """The rejection for `reason` (BUSY, QUEUE_TIMEOUT, DRAINING, STARTING, GROUP_FAILED, GROUP_DOWN), counted;
        the caller raises it."""
        self.rejected[reason] += 1
        if reason == "GROUP_FAILED":
            groups = self.failed_groups
            named = ", ".join(repr(group) for group in groups)
            return AdmissionRejected(
                "UNAVAILABLE",
                reason,
                f"process group{'s' if len(groups) > 1 else ''} {named} FAILED (its restarts ran out; `stagevisor "
                f"status` shows why): no request can pass until an operator runs `stagevisor restart "
                f"{groups[0] if groups else 'GROUP'}`; do not retry before",
                retry_after=None,
            )
        if reason == "GROUP_DOWN":
            groups = self.down_groups
            named = ", ".join(repr(group) for group in groups)
            retry = self.retry_after_unavailable()
            return AdmissionRejected(
                "UNAVAILABLE",
                reason,
                f"process group{'s' if len(groups) > 1 else ''} {named} {'has' if len(groups) == 1 else 'have'} no "
                f"worker taking requests: it restarts (`stagevisor status` shows how far); retry in {retry} s",
                retry_after=retry,
            )
        if reason == "STARTING":
            return AdmissionRejected(
                "UNAVAILABLE",
                reason,
                "the daemon is starting: its workers are not all ready yet; retry in a few seconds",
                retry_after=self.retry_after(),
            )
        if reason == "DRAINING":
            return AdmissionRejected(
                "UNAVAILABLE",
                reason,
                "the daemon is shutting down and admits no new requests; retry on another replica",
                retry_after=self.retry_after(),
            )
        limits = self.limits
        if reason == "BUSY":
            message = (
                f"the daemon is busy: {counted(self.running, 'request')} running (limit {limits.max_concurrent}) "
                f"and {self.queued} queued (limit {limits.max_queued}); retry later"
            )
        else:
            message = (
                f"the request waited {limits.queue_timeout:g}s in the queue without getting a slot "
                f"({limits.max_concurrent} running); retry later"
            )
        return AdmissionRejected("RESOURCE_EXHAUSTED", reason, message, retry_after=self.retry_after())

    async def acquire(self) -> Slot:
        """A slot now, or after waiting in the queue; AdmissionRejected when there is none to be had."""
        if self.draining:
            raise self.reject("DRAINING")
        if self.starting:
            raise self.reject("STARTING")
        if self.failed_groups:
            raise self.reject("GROUP_FAILED")
        if self.down_groups:
            raise self.reject("GROUP_DOWN")
        if self._has_room() and not self.queued:
            return self._grant()
        if self.queued >= self.limits.max_queued:
            raise self.reject("BUSY")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        timeout = self.limits.queue_timeout or None
        try:
            # asyncio.wait, not wait_for: before Python 3.12, wait_for swallows a cancellation that comes after
            # the grant but before this task resumed and returns the slot, to a caller that was cancelled (an
            # HTTP client gone while queued: unless_disconnected drops it) and so never releases it.
            await asyncio.wait((waiter,), timeout=timeout)
        except asyncio.CancelledError:
            # The client went away while queued: hand a slot granted meanwhile to the next waiter.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().release()
            waiter.cancel()
            raise
        finally:
            self._discard(waiter)
        if not waiter.done():  # the queue timeout passed (a slot granted in that same instant is kept)
            waiter.cancel()
            raise self.reject("QUEUE_TIMEOUT")
        return waiter.result()

    def _grant(self) -> Slot:
        self.running += 1
        return Slot(self, self._clock())

    def _discard(self, waiter: asyncio.Future) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def _release(self, slot: Slot) -> None:
        self.running -= 1
        self._mean_service = 0.8 * self._mean_service + 0.2 * max(0.0, self._clock() - slot._started)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._has_room():
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            if self.draining:
                waiter.set_exception(self.reject("DRAINING"))
            else:
                waiter.set_result(self._grant())

    def drain(self) -> None:
        """Admit nothing more: new and queued requests get UNAVAILABLE; running ones go on."""
        self.draining = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(self.reject("DRAINING"))

    def snapshot(self) -> dict[str, object]:
        """Limits and current counts, for the topology page and logs."""
        return {
            "running": self.running,
            "queued": self.queued,
            "draining": self.draining,
            "max_concurrent": self.limits.max_concurrent,
            "max_queued": self.limits.max_queued,
            "queue_timeout": self.limits.queue_timeout,
            "rejected": dict(self.rejected),
        }
