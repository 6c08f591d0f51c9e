"""The daemon's shutdown steps: drain the requests in flight, stop every worker, and go on past a step that fails.

A shutdown that stops half-way leaves workers running, and the interpreter then waits on those non-daemonic
children forever: so each step is run through `step`, which logs a failure and returns, and `stop_workers`
kills any worker still running after its runner stopped. The daemon (core.py) runs the steps in order.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from typing import Awaitable, Protocol

from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.daemon.runner import WorkerRunner
from stagevisor.supervisor.numbers import counted

log = logging.getLogger("stagevisor.daemon")


class DrainGateway(Protocol):
    """What a drain asks of the data plane's gateway: refuse new requests, count those in flight."""

    def stop_accepting(self) -> None: ...

    def in_flight(self) -> int: ...


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


async def drain(gateway: DrainGateway, deadline: DrainDeadline) -> None:
    """New requests are refused; those in flight get until `deadline` to finish, then are cancelled."""
    gateway.stop_accepting()  # drain what is in flight; new requests go elsewhere (UNAVAILABLE)
    while gateway.in_flight() > 0 and time.monotonic() < deadline.at:
        await asyncio.sleep(0.05)
    if gateway.in_flight() > 0:
        log.warning("drain timeout: cancelling %s still in flight", counted(gateway.in_flight(), "request"))


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
