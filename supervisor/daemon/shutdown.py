"""The daemon's shutdown steps: drain the requests in flight, stop every worker, and go on past a step that fails.

A shutdown that stops half-way leaves workers running, and the interpreter then waits on those non-daemonic
children forever: so each step is run through `step`, which logs a failure and returns, and `stop_workers`
kills any worker still running after its runner stopped. `shut_down` runs the steps in order for the daemon
(core.py), which it asks through ShutdownHost.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from pathlib import Path
from typing import Awaitable, Callable, Mapping, Protocol

from stagevisor.supervisor.daemon import systemd
from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.daemon.lifecycle import DaemonState
from stagevisor.supervisor.daemon.runner import WorkerRunner
from stagevisor.supervisor.daemon.runtime_files import remove_private_tree
from stagevisor.supervisor.numbers import counted

log = logging.getLogger("stagevisor.daemon")


class DrainGateway(Protocol):
    """What a drain asks of the data plane's gateway: refuse new requests, count those in flight."""

    def stop_accepting(self) -> None: ...

    def in_flight(self) -> int: ...


class ShutdownGateway(DrainGateway, Protocol):
    """What a shutdown asks of the data plane's gateway: drain it, stop it, then remove its shared-memory area."""

    shm_dir: str
    """The private shared-memory directory workers map large payloads in (they get it in their spec)."""

    async def stop(self, grace: float) -> None: ...

    def remove_shared_area(self) -> None:
        """Remove that directory and whatever is left in it; called once the workers have stopped."""


class Stops(Protocol):
    """A part of the daemon a shutdown stops before its workers: the autoscaler, the resource monitor."""

    async def stop(self) -> None: ...


class StartingChanges(Protocol):
    """The daemon's live changes (live_change.py): a shutdown stops the workers an apply is starting."""

    async def abort_starting(self) -> None: ...

    def retired_in_flight(self) -> int:
        """Requests an apply's old topology, replaced but still finishing them, holds (0 when none drains)."""


class Watchers(Protocol):
    """The daemon's event feed (events.py): a shutdown ends every watcher's stream."""

    def end(self) -> None: ...


class ShutdownHost(Protocol):
    """What a shutdown stops, in order: the daemon (core.py's Daemon) and what it runs."""

    @property
    def gateway(self) -> ShutdownGateway: ...

    @property
    def runners(self) -> Mapping[str, WorkerRunner]:
        """The topology's workers (name -> runner)."""

    @property
    def retiring(self) -> list[WorkerRunner]:
        """Runners outside the topology a shutdown stops too (an apply's old workers, a restart's new or old one)."""

    @property
    def launcher(self) -> DaemonLauncher: ...

    @property
    def drain_deadline(self) -> DrainDeadline: ...

    @property
    def systemd_status(self) -> systemd.StatusLine: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def autoscaling(self) -> Stops: ...

    @property
    def changes(self) -> StartingChanges: ...

    @property
    def monitor(self) -> Stops: ...

    @property
    def events(self) -> Watchers: ...

    def set_state(self, state: DaemonState) -> None: ...


async def step(what: str, awaitable: Awaitable[object]) -> None:
    """Await one step of a shutdown; a failure is logged (with `what` failed) and the shutdown goes on."""
    try:
        await awaitable
    except Exception:  # noqa: BLE001 - logged; the remaining shutdown steps still run
        log.exception("shutdown: could not %s; going on with the rest of the shutdown", what)


class DrainDeadline:
    """When a drain ends at the latest (monotonic clock): a later stop with a shorter grace brings it forward,
    never back."""

    def __init__(self) -> None:
        self.at = float("inf")

    def within(self, budget: float) -> None:
        """End the drain `budget` seconds from now, if that is sooner than it would have ended."""
        self.at = min(self.at, time.monotonic() + budget)


async def drain(gateway: DrainGateway, deadline: DrainDeadline, retired: Callable[[], int] = lambda: 0) -> None:
    """New requests are refused; those in flight get until `deadline` to finish, then are cancelled. `retired`
    counts those an apply's old topology still holds (its own gateway takes no new ones): waited for as well."""
    gateway.stop_accepting()  # drain what is in flight; new requests go elsewhere (UNAVAILABLE)

    def left() -> int:
        return gateway.in_flight() + retired()

    while left() > 0 and time.monotonic() < deadline.at:
        await asyncio.sleep(0.05)
    if left() > 0:
        log.warning("drain timeout: cancelling %s still in flight", counted(left(), "request"))


async def stop_workers(runners: list[WorkerRunner], launcher: DaemonLauncher) -> None:
    """Stop every runner in parallel, then close the launcher; a runner whose stop fails has its worker killed."""
    pids = {
        pid
        for runner in runners
        for pid in (runner.lifecycle.pid, runner.worker.pid if runner.worker is not None else 0)
        if pid
    }
    results = await asyncio.gather(*(runner.stop() for runner in runners), launcher.close(), return_exceptions=True)
    for runner, result in zip(runners, results, strict=False):  # results end with the launcher's close
        if isinstance(result, Exception):
            log.error(
                "shutdown: stopping group %r failed (%s: %s); killing its worker",
                runner.name,
                type(result).__name__,
                result,
                exc_info=result,
            )
    # Last resort: a worker process still running after its runner stopped is
    # killed, so the interpreter never waits on it at exit.
    for child in multiprocessing.active_children():
        if child.pid in pids and child.is_alive():
            log.error("shutdown: worker pid %d is still running; sending SIGKILL", child.pid)
            child.kill()
            await asyncio.get_running_loop().run_in_executor(None, child.join, 10.0)


async def shut_down(host: ShutdownHost, drain_budget: float) -> None:
    """Drain the requests in flight (for up to `drain_budget` seconds, or less if a later stop shortens it), stop
    the data plane and every worker, remove the run directory, end the watchers. Every step runs whatever failed
    before it (each is logged)."""
    host.set_state(DaemonState.STOPPING)
    await host.autoscaling.stop()
    await host.changes.abort_starting()
    try:
        host.systemd_status.tell("STATUS=draining", "STOPPING=1")
        host.drain_deadline.within(drain_budget)
        await step("drain in-flight requests", drain(host.gateway, host.drain_deadline, host.changes.retired_in_flight))
        await step("stop the data plane", host.gateway.stop(1.0))
    finally:
        try:
            # With those outside the topology: an apply's old workers, a restart's new or old one.
            await stop_workers([*host.runners.values(), *host.retiring], host.launcher)
        finally:
            try:
                host.gateway.remove_shared_area()  # no worker writes there now
            except Exception:  # noqa: BLE001 - shutdown must finish; the next daemon's start sweeps it
                log.exception("shutdown: could not remove the shared-memory directory %s", host.gateway.shm_dir)
            await step("stop the resource monitor", host.monitor.stop())
            try:
                remove_private_tree(host.run_dir)
            except Exception:  # noqa: BLE001 - shutdown must finish; the sweep at next start retries
                log.exception("shutdown: could not remove %s", host.run_dir)
            host.set_state(DaemonState.STOPPED)
            host.events.end()  # end every WatchEvents stream
            log.info("stopped")
