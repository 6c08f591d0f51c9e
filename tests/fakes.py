"""Test doubles shared by the suite: a controllable clock, a fake launcher and its workers, bounded waits.

Tests import these instead of redefining them per file (supervisord keeps its
`Dummy*` fakes in one `tests/base.py` for the same reason). Nothing here
starts a process or opens a socket.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from stagevisor.supervisor.daemon.runner import RunnerHooks
from stagevisor.supervisor.daemon.launcher import Handshake, WorkerStartError


class FakeClock:
    """A clock that moves only when the test says so: `clock()` reads it, `clock.advance(s)` moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeWorker:
    """A Worker handle (launcher.Worker) whose handshake and exit the test controls.

    `outcome` decides the handshake: "ready" answers it, "fail" exits 1 and
    raises WorkerStartError, "hang" never answers, "ignore-term" answers but
    survives SIGTERM (only SIGKILL ends it).
    """

    def __init__(self, pid: int, outcome: str = "ready") -> None:
        self.pid = pid
        self.outcome = outcome
        self.exited: asyncio.Future = asyncio.get_running_loop().create_future()
        self.wedged: asyncio.Future = asyncio.get_running_loop().create_future()
        self.signals: list[str] = []
        self.closed = False

    async def handshake(self, timeout: float) -> Handshake:
        if self.outcome == "fail":
            self.exit(1)
            raise WorkerStartError("g", "stage 'x' failed to build: boom", stage="x", traceback="Traceback ...")
        if self.outcome == "hang":
            await asyncio.Event().wait()
        return Handshake(self.pid, fraction_enforced=False)

    async def wait_exit(self) -> int:
        return await asyncio.shield(self.exited)

    async def unresponsive(self) -> str:
        await self.wedged
        return f"worker pid {self.pid} did not answer its heartbeat for 5s"

    def wedge(self) -> None:
        """The worker's event loop stops answering (a stage blocked it, or SIGSTOP)."""
        if not self.wedged.done():
            self.wedged.set_result(None)

    def exitcode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    def exit(self, code: int) -> None:
        if not self.exited.done():
            self.exited.set_result(code)

    def terminate(self) -> None:
        self.signals.append("TERM")
        if self.outcome != "ignore-term":
            self.exit(-15)

    def kill(self) -> None:
        self.signals.append("KILL")
        self.exit(-9)

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    """Hands out FakeWorkers with pids 100, 101, ...; each takes the next outcome from the list ("ready" after)."""

    def __init__(self, outcomes: list[str] | None = None) -> None:
        self.outcomes = list(outcomes or [])
        self.workers: list[FakeWorker] = []

    def start(self, spec: Any) -> FakeWorker:
        outcome = self.outcomes.pop(0) if self.outcomes else "ready"
        worker = FakeWorker(100 + len(self.workers), outcome)
        self.workers.append(worker)
        return worker


class RunnerRecorder:
    """Records what a GroupRunner reports (events, failures, lost workers) and the backoff delays it sleeps."""

    def __init__(self) -> None:
        self.events: list = []
        self.failures: list = []
        self.lost: list[tuple[str, str]] = []
        self.sleeps: list[float] = []

    def hooks(self) -> RunnerHooks:
        return RunnerHooks(
            on_event=self.events.append,
            on_failure=self.failures.append,
            on_worker_lost=lambda group, reason: self.lost.append((group, reason)),
        )

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)

    def states(self) -> list[tuple[str, str]]:
        return [(e.old_state.value, e.new_state.value) for e in self.events]


async def settle(predicate: Callable[[], Any], limit: int = 1000) -> None:
    """Yield to the event loop until `predicate()` holds; fail after `limit` turns (no wall clock involved)."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never reached")


async def poll_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.005) -> Any:
    """Poll `predicate` on the running loop until it is truthy or `timeout` passes; return its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := predicate()) and loop.time() < deadline:
        await asyncio.sleep(interval)
    return value
