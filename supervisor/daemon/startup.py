"""Daemon startup: every worker spawned in plan order and awaited until READY; the first failure is the root cause.

One failure fails startup: the other workers are no longer awaited (their runners reap them), and the daemon
raises StartupError with every failure, first first; `format_startup_failure` is what `stagevisor serve` prints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from stagevisor.supervisor.daemon.runner import Failure, WorkerRunner, ready_fault
from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode, WorkerStartError

log = logging.getLogger("stagevisor.daemon")


class StartupError(DaemonError):
    """A worker failed to start at daemon startup; `failures` are in the order they happened."""

    def __init__(self, failures: list[Failure]) -> None:
        first = failures[0]
        super().__init__(f"group {first.group!r} failed to start: {first.message}", code=DaemonErrorCode.STARTUP_FAILED)
        self.failures = failures


async def start_workers(runners: list[WorkerRunner], on_failure: Callable[[Failure], None]) -> None:
    """Spawn each runner's worker in order and wait until all are READY or one fails; each failure goes to
    `on_failure`, stamped when it happened."""
    waits: list[asyncio.Task[None]] = []
    try:
        for runner in runners:
            runner.spawn(reason="daemon startup")
            waits.append(asyncio.create_task(_await_ready(runner, on_failure), name=f"ready-{runner.name}"))
        await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
    except WorkerStartError as error:
        on_failure(Failure(error.group, error.message, time=time.time()))
    finally:
        # One failure fails startup: stop waiting for the others (this reaps their workers).
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def _await_ready(runner: WorkerRunner, on_failure: Callable[[Failure], None]) -> None:
    try:
        await runner.await_ready()
    except WorkerStartError as error:
        # Stamped when it happened (reaping the worker takes longer for some than for others),
        # so the first failure in time is the root cause.
        on_failure(Failure(error.group, error.message, error.stage, error.traceback, error.time))
        raise
    except Exception as error:
        # The worker answered; the daemon's own handling of its READY (a hook on the transition) failed.
        # Startup fails naming the group: the runner starts watching a worker only after its hooks, so
        # serving on would leave this worker's exit unnoticed.
        log.exception("group %r: the daemon failed while taking its worker READY", runner.name)
        on_failure(ready_fault(runner.name, error, time.time()))
        raise


def format_startup_failure(error: StartupError) -> str:
    """The root cause first (with its traceback), then any later failures, one line each."""
    first, *rest = error.failures
    lines = [f"error: {error.code.value}: {error.message}"]
    if first.traceback:
        lines.append(first.traceback.rstrip())
    for later in rest:
        lines.append(f"also: group {later.group!r}: {later.message}")
    return "\n".join(lines)


def process_start() -> float:
    """When this process started (wall clock), so READY says how long the operator waited."""
    import psutil

    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()
