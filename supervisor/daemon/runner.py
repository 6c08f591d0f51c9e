"""WorkerRunner: supervises one worker (a group's, or one replica's): start, watch (exit, heartbeat), restart, stop.

Drives the GroupLifecycle state machine from what the launcher's WorkerHandle
reports; all OS effects go through that handle, so a fake launcher
exercises this module without processes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from stagevisor.supervisor.dataplane.client_failures import OUTLASTED_STOP_TIMEOUT
from stagevisor.supervisor.errors import StoppedWhileStarting, WorkerStartError
from stagevisor.supervisor.reports import RootCause
from stagevisor.supervisor.daemon.handle import WorkerHandle, WorkerLauncher, describe_exit
from stagevisor.supervisor.daemon.lifecycle import BackoffPolicy, GroupLifecycle, GroupState, LifecycleEvent
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")

_RESTART_COUNTS = itertools.count(1)
"""Ids of restart counts (WorkerRunner.restart_count_id), unique within the daemon's life."""
S = GroupState


@dataclass(frozen=True)
class Failure:
    """One failure of a group: a worker that did not start, or one that died. The first is the root cause."""

    group: str
    message: str
    stage: str = ""
    traceback: str = ""
    time: float = 0.0

    def root_cause(self, recovered_at: float | None = None) -> RootCause:
        """As status reports it when it is the first failure of an incident; `recovered_at`: when that ended."""
        return RootCause(self.group, self.stage, self.message, self.traceback, self.time, recovered_at)


def ready_fault(group: str, error: Exception, when: float) -> Failure:
    """The failure of the daemon's own handling of a worker's READY (a hook on the transition): a daemon bug,
    not the worker's; whoever catches it logs the traceback first."""
    message = (
        f"the daemon failed while taking its worker READY: {type(error).__name__}: {error} "
        "(a daemon bug: the traceback is in the log above)"
    )
    return Failure(group, message, time=when)


SHUTDOWN = "daemon shutdown"
"""The reason a worker stops, or is not restarted, once the daemon stops."""


@dataclass
class RunnerHooks:
    """How a WorkerRunner reports to its daemon."""

    on_event: Callable[[LifecycleEvent], None]
    on_failure: Callable[[Failure], None]
    on_worker_lost: Callable[[str, str], None]
    """(worker, reason): the worker's name (a group's, or `group/i` for a replica) and why it is gone; the data
    plane fails the requests it held."""
    not_restarted: Callable[[], str] = lambda: ""
    """Why a worker that exits now is not restarted, "" while it would be: the daemon stops, or the runner's
    worker only finishes what it holds (a restart without a pause or an apply replaced it). The reason is the
    one its STOPPED transition gives."""
    on_silence: Callable[[str, str], None] = lambda worker, reason: None
    """(worker, why it is silent, "" once it beats again): its worker missed SILENT_BEATS heartbeats in a row,
    well before the heartbeat timeout kills it; the daemon takes a silent replica out of rotation meanwhile."""


def transition(event: LifecycleEvent) -> str:
    """A worker's transition as the daemon log writes it: `OLD -> NEW pid N (reason)`."""
    pid = f" pid {event.pid}" if event.pid else ""
    reason = f" ({event.reason})" if event.reason else ""
    return f"{event.old_state.value} -> {event.new_state.value}{pid}{reason}"


class WorkerRunner:
    """Owns one worker (a process group's, or one replica's) and the guarded transitions of its lifecycle.

    Operations on one group are serialized by a lock; a watch task per live
    worker notices its exit (the sentinel, so within milliseconds) or its
    missed heartbeat (then kills it, so a wedged worker takes the same path as
    a crashed one) and runs the restart-with-backoff loop.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        launcher: WorkerLauncher,
        policy: BackoffPolicy,
        hooks: RunnerHooks,
        *,
        start_timeout: float,
        stop_timeout: float,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        """The worker's name: the group's, or `group/index` for a replica."""
        self.launcher = launcher
        self.policy = policy
        self.hooks = hooks
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        """How long the next worker started gets between SIGTERM and SIGKILL (its spec says the same to it)."""
        self.worker_stop_timeout = stop_timeout
        """The current worker's: the stop timeout it was started with, which a `rename` (a rescale) leaves, since
        the worker drains for what it was told."""
        # Through self.hooks, not the callable itself: an apply hands a runner's reports to a new owner.
        self.lifecycle = GroupLifecycle(self.name, listener=lambda event: self.hooks.on_event(event), clock=clock)
        self.restart_count_id = next(_RESTART_COUNTS)
        """Which count `restarts` is: a new one, from 0, for a new runner (an apply's, a scale's), its predecessor's
        once it `follow`s one. The metrics registry adds what each count grew by to the worker's counter, so a
        restart is counted once even where a new runner's count climbs back to the old one's between scrapes."""
        self.worker: WorkerHandle | None = None
        self.worker_name = self.name
        """The name the current worker was started under, which it answers frames with; a `rename` leaves it."""
        self.fraction_enforced = False
        self.physical_gpu: str | None = None
        self.device = ""
        self.voices: tuple[dict, ...] = ()
        self.max_text_chars: int | None = None
        self.host = ""
        self.node_id = ""
        self._clock = clock
        self._sleep = sleep
        self._ready_at = 0.0
        self._restart_at = 0.0  # on its clock: when the worker in BACKOFF is started again
        self._watch_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._restart_task: asyncio.Task | None = None
        self._stopping = False
        """True while `stop` runs: an operator restart still stopping the old worker then starts no new one."""
        self.silence = ""
        """Why the current worker counts as silent (it missed heartbeats, handle.SILENT_BEATS); "" while it beats."""
        self._silent_since: float | None = None
        """On its clock: when the daemon took the current worker for silent; None while it beats."""

    def rename(self, spec: WorkerSpec) -> None:
        """Take a new spec and name (a group scaled between 1 and more replicas: `vocoder` <-> `vocoder/0`).

        The running worker keeps its address; the spec is what its next restart starts from.
        """
        self.spec = spec
        self.name = self.lifecycle.group = spec.name

    def follow(self, predecessor: WorkerRunner) -> None:
        """Replace `predecessor`'s worker with this one's, started beside it (a restart without a pause): the
        group's restart count goes on from there. Called as this one takes the group, with no await since it
        was READY, so it has no restarts of its own yet and the predecessor's are all in."""
        self.lifecycle.restarts = predecessor.restarts + 1
        self.restart_count_id = predecessor.restart_count_id

    @property
    def state(self) -> GroupState:
        return self.lifecycle.state

    @property
    def pid(self) -> int | None:
        """The current worker's pid, or None while none runs."""
        return self.lifecycle.pid

    @property
    def restarts(self) -> int:
        return self.lifecycle.restarts

    @property
    def started_at(self) -> float | None:
        return self.lifecycle.started_at

    @property
    def consecutive_crashes(self) -> int:
        """Crashes in a row not followed by a stable run (0 once READY for the policy's `stable_after`)."""
        if self.state is S.READY and self._clock() - self._ready_at >= self.policy.stable_after:
            return 0
        return self.policy.consecutive

    def silent_s(self) -> float | None:
        """Seconds since the daemon took the current worker for silent (the moment the warning and the
        `stagevisor_group_silent` gauge went up); None while it beats or none runs."""
        since = self._silent_since
        return None if since is None or not self.silence else max(0.0, self._clock() - since)

    def restart_in(self) -> float | None:
        """Seconds until the worker, in BACKOFF, is started again; None in any other state."""
        if self.state is not S.BACKOFF:
            return None
        return max(0.0, self._restart_at - self._clock())

    def fail_startup(self, reason: str) -> None:
        """Mark a group whose first worker never started as FAILED (daemon startup gave up on it)."""
        if self.state is S.STARTING and self.worker is None:
            self.lifecycle.transition(S.FAILED, leaving=(S.STARTING,), reason=reason)

    def spawn(self, reason: str = "") -> None:
        """Start the worker process (-> STARTING); call `await_ready` next."""
        self.lifecycle.transition(S.STARTING, leaving=(S.STOPPED, S.BACKOFF, S.FAILED), reason=reason)
        try:
            self.worker = self.launcher.start(self.spec)
        except Exception as error:  # fork_exec failures: out of pids, out of memory
            raise WorkerStartError(self.name, f"could not start a worker process: {error}") from error
        self.worker_name = self.spec.name
        self.worker_stop_timeout = self.stop_timeout
        self.lifecycle.pid = self.worker.pid

    async def await_ready(self) -> None:
        """Wait for the handshake (-> READY); on failure or cancellation the worker is reaped."""
        worker = self.worker
        assert worker is not None, "spawn() first"
        try:
            handshake = await worker.handshake(self.start_timeout)
        except BaseException as error:
            if self.worker is not worker and isinstance(error, Exception):
                raise StoppedWhileStarting(self.name) from None  # `stop` took the worker over and ends it
            if self.worker is worker:
                self.worker = None
                await self._reap(worker)
            raise
        if self.worker is not worker:  # READY just as `stop` took it over: it is stopping, not READY
            raise StoppedWhileStarting(self.name)
        self.fraction_enforced = handshake.fraction_enforced
        self.physical_gpu, self.device = handshake.physical_gpu, handshake.device
        self.voices = handshake.voices
        self.max_text_chars = handshake.max_text_chars
        self.host = handshake.host
        self.node_id = handshake.node_id
        self._ready_at = self._clock()
        self.lifecycle.transition(S.READY, leaving=(S.STARTING,), pid=worker.pid, reason=handshake.describe_phases())
        self._watch_task = asyncio.create_task(self._watch(worker), name=f"watch-{self.name}")

    async def _watch(self, worker: WorkerHandle) -> None:
        exited = asyncio.ensure_future(worker.wait_exit())
        wedged = asyncio.ensure_future(worker.unresponsive())
        silence = asyncio.ensure_future(self._follow_silence(worker))
        try:
            await asyncio.wait({exited, wedged}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            silence.cancel()
            wedged.cancel()
            if not exited.done():
                exited.cancel()  # wait_exit is shielded: cancelling this waiter leaves the others be
        reason = ""
        if not exited.done():
            # Alive but deaf: SIGKILL (it works on a stopped process too), then the crash path below.
            reason = f"{wedged.result()}; killed it"
            log.error("%s", reason)
            # Its requests fail now, saying why, before the kill breaks their links with a vaguer error.
            self.hooks.on_worker_lost(self.name, reason)
            worker.kill()
            try:
                code = await asyncio.wait_for(worker.wait_exit(), 10.0)
            except asyncio.TimeoutError:  # uninterruptible sleep in a driver
                code = None
                log.error("worker pid %d of group %r survived SIGKILL for 10s", worker.pid, self.name)
        else:
            code = exited.result()
        async with self._lock:
            if self.worker is not worker:
                return  # an intentional stop already took this worker over
            self.worker = None
            worker.close()
            if not reason:
                reason = f"worker pid {worker.pid} of group {self.name!r} exited unexpectedly ({describe_exit(code)})"
                log.error("%s", reason)
                self.hooks.on_worker_lost(self.name, reason)
            not_restarted = self.hooks.not_restarted()
            if not_restarted:
                self.lifecycle.transition(S.STOPPING, leaving=(S.READY,), reason=reason)
                self.lifecycle.transition(S.STOPPED, leaving=(S.STOPPING,), reason=not_restarted)
                return
            self.hooks.on_failure(Failure(self.name, reason, time=self._clock()))
            await self._recover(reason, ready_for=self._clock() - self._ready_at)

    async def _follow_silence(self, worker: WorkerHandle) -> None:
        """While the worker is watched: report when it goes silent and when it beats again (`on_silence`)."""
        try:
            while True:
                self.silence = await worker.silent()
                self._silent_since = self._clock()
                self.hooks.on_silence(self.name, self.silence)
                await worker.beating()
                self.silence, self._silent_since = "", None
                self.hooks.on_silence(self.name, "")
        except Exception:  # a daemon bug: the heartbeat timeout still watches the worker
            log.exception("group %r: following its worker's heartbeats failed", self.name)
        finally:
            # Its watch ended (it exited, was killed or is being stopped): its state tells from here on.
            self.silence, self._silent_since = "", None

    async def _recover(self, reason: str, ready_for: float | None) -> None:
        """Restart with exponential backoff until READY or the limit is reached (-> FAILED)."""
        while True:
            decision = self.policy.after_exit(ready_for=ready_for)
            if not decision.restart:
                self.lifecycle.transition(
                    S.FAILED,
                    leaving=(S.READY, S.STARTING),
                    reason=f"{reason}; gave up after {self.policy.max_restarts} consecutive restarts",
                )
                log.error("group %r FAILED: restart limit %d reached", self.name, self.policy.max_restarts)
                return
            self._restart_at = self._clock() + decision.delay  # before the transition: its listeners ask
            self.lifecycle.transition(
                S.BACKOFF,
                leaving=(S.READY, S.STARTING),
                reason=f"{reason}; {self.policy.describe(decision)}",
            )
            await self._sleep(decision.delay)
            self.lifecycle.restarts += 1
            try:
                self.spawn(reason=f"restart {decision.attempt}")
                await self.await_ready()
                return
            except WorkerStartError as error:
                self.hooks.on_failure(Failure(self.name, error.message, error.stage, error.traceback, self._clock()))
                reason, ready_for = error.message, None
            except Exception as error:
                # The worker answered; the daemon's handling of its READY failed. Raised on, it would end this
                # watch task unseen and leave a worker nothing watches: stop it, and the group is FAILED.
                log.exception("group %r: the daemon failed while taking its restarted worker READY", self.name)
                await self._fail_unwatched(ready_fault(self.name, error, self._clock()))
                return

    async def _fail_unwatched(self, failure: Failure) -> None:
        """FAILED for `failure`, and the worker no watch task follows (if one started) stopped."""
        self.hooks.on_failure(failure)
        self.lifecycle.transition(S.FAILED, leaving=(S.STARTING, S.READY), reason=failure.message)
        worker, self.worker = self.worker, None
        if worker is not None:
            await self._terminate(worker)

    async def _recover_in_background(self, reason: str) -> None:
        async with self._lock:
            await self._recover(reason, ready_for=None)

    async def _cancel_watch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def restart(self) -> tuple[int, int]:
        """Replace the worker with a new process (operator request); return (old pid, new pid).

        Requests that arrive while a restart runs share it: two operators
        restarting one group get one new worker, not two in a row.
        WorkerStartError when the new worker does not start (it is retried with backoff); DaemonError when
        the daemon's handling of its READY fails (`ready_fault`: the group is FAILED, the worker stopped).
        """
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.create_task(self._restart(), name=f"restart-{self.name}")
        task = self._restart_task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # the caller's own cancellation
            # `stop` cut it short (a shutdown, an apply retiring the group): its new worker is reaped.
            raise StoppedWhileStarting(self.name) from None

    async def _restart(self) -> tuple[int, int]:
        old_pid = self.lifecycle.pid
        await self._cancel_watch()
        async with self._lock:
            if self.state is S.FAILED:
                self.policy.reset()  # the operator revives the group: give it a fresh budget
            else:
                await self._stop_worker("restart requested by operator")
            if self._stopping:  # `stop` came while the old worker stopped: it waits for this lock
                raise asyncio.CancelledError
            self.lifecycle.restarts += 1
            try:
                self.spawn(reason="restart requested by operator")
                await self.await_ready()
            except WorkerStartError as error:
                self.hooks.on_failure(Failure(self.name, error.message, error.stage, error.traceback, self._clock()))
                self._watch_task = asyncio.create_task(self._recover_in_background(error.message))
                raise
            except Exception as error:
                # As in _recover: the daemon's handling of the READY failed, and no watch task follows the worker.
                log.exception("group %r: the daemon failed while taking its restarted worker READY", self.name)
                failure = ready_fault(self.name, error, self._clock())
                await self._fail_unwatched(failure)
                raise WorkerStartError(  # INTERNAL for the operator: a daemon fault, not a refusal
                    self.name,
                    failure.message,
                    advice=f"the group is FAILED; `stagevisor restart {self.name}` starts it again",
                ) from None
        return old_pid, self.lifecycle.pid

    async def stop(self, reason: str = SHUTDOWN) -> None:
        """Stop the worker (TERM, then KILL past the stop timeout) and end in STOPPED. Idempotent.

        An operator restart is cut short: a new worker starting is stopped now, not once its handshake ends (a
        model's load, up to the start timeout); none starts once the old one is stopped; the restart fails
        saying so.
        """
        self._stopping = True
        try:
            await self._cancel_watch()
            restart = self._restart_task
            if restart is not None and not restart.done() and self.state is S.STARTING:
                # Only while it waits for the handshake: cancelled while it stops the old worker, it would leave
                # that one half-stopped.
                restart.cancel()
                await asyncio.gather(restart, return_exceptions=True)
            async with self._lock:
                await self._stop_worker(reason)
        finally:
            self._stopping = False

    async def _stop_worker(self, reason: str) -> None:
        if self.state is S.STOPPED:
            return
        self.lifecycle.transition(S.STOPPING, reason=reason)
        worker, self.worker = self.worker, None
        if worker is not None:
            await self._terminate(worker)
        self.lifecycle.transition(S.STOPPED, leaving=(S.STOPPING,), reason=reason)

    async def _terminate(self, worker: WorkerHandle) -> None:
        worker.terminate()
        # The heartbeat still counts while the worker drains: a stopped or blocked worker never drains, and
        # a replica's stop timeout includes --request-timeout.
        exited = asyncio.ensure_future(worker.wait_exit())
        wedged = asyncio.ensure_future(worker.unresponsive())
        try:
            await asyncio.wait({exited, wedged}, timeout=self.worker_stop_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wedged.cancel()
            exited.cancel()  # wait_exit is shielded: cancelling this waiter leaves the others be
        if exited.done() and not exited.cancelled():
            worker.close()
            code = exited.result()
            if code not in (None, 0, -signal.SIGTERM):  # SIGTERM's default action: it never served
                # It died while it drained (a crash, a kill): what it still held is lost with it, as below.
                reason = f"worker pid {worker.pid} of group {self.name!r} died while it stopped ({describe_exit(code)})"
                log.error("%s", reason)
                self.hooks.on_worker_lost(self.name, reason)
            return
        why = (
            f"{wedged.result()} while stopping"
            if wedged.done() and not wedged.cancelled()
            else (
                f"worker pid {worker.pid} of group {self.name!r} {OUTLASTED_STOP_TIMEOUT} "
                f"({self.worker_stop_timeout:.1f}s after SIGTERM)"
            )
        )
        log.warning("%s; sending SIGKILL", why)
        # What it still held is lost with it: those requests fail now, saying why (a replica's senders learn
        # it is gone, or they wait on it until the client's deadline).
        self.hooks.on_worker_lost(self.name, f"{why}; killed it")
        await self._reap(worker)

    async def _reap(self, worker: WorkerHandle) -> None:
        worker.kill()
        try:
            await asyncio.wait_for(worker.wait_exit(), 10.0)
        except asyncio.TimeoutError:  # uninterruptible sleep in a driver; nothing more we can do
            log.error("worker pid %d of group %r survived SIGKILL for 10s", worker.pid, self.name)
        worker.close()
