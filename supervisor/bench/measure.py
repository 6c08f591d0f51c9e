"""One measurement of a workload against a serving daemon: its runs, the workers' resources, refusals that end it."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

import psutil

from stagevisor.supervisor.bench.loadgen import (
    GrpcClient,
    NoneSucceeded,
    Outcome,
    closed_loop,
    open_loop,
    summarize,
)
from stagevisor.supervisor.bench.results import Row, figures
from stagevisor.supervisor.bench.workload import Workload

if TYPE_CHECKING:
    from stagevisor.supervisor.security.client import ClientSecurity

REFUSED = frozenset(
    {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "UNIMPLEMENTED", "NOT_FOUND", "FAILED_PRECONDITION"}
)
"""The statuses of a request that cannot succeed as sent (a bad option, no token, a text over the limit): the same
workload is refused again however long it runs."""
REFUSALS_TO_GIVE_UP = 16
"""Refused requests, none succeeded, after which a measured run stops with REQUESTS_FAILED (RefusalWatch): enough to
say the workload is refused, not one request of it, and few enough to say so at once."""


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPUs and the load average (1, 5, 15 minutes) right now."""
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


class Resources:
    """Samples each worker's resident memory (peak) and CPU seconds over one measured run (psutil)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {}
        for group, pid in pids.items():
            try:
                self.processes[group] = psutil.Process(pid)
            except psutil.Error:
                continue
        self.cpu_start = {g: self._cpu(p) for g, p in self.processes.items()}
        self.peak = {g: 0 for g in self.processes}
        self._task: asyncio.Task | None = None

    @staticmethod
    def _cpu(process: Any) -> float | None:
        try:
            times = process.cpu_times()
            return times.user + times.system
        except (
            psutil.NoSuchProcess,
            psutil.AccessDenied,
        ):  # the worker is gone (restarted): no figure, not a wrong one
            return None

    def sample(self) -> None:
        for group, process in self.processes.items():
            try:
                self.peak[group] = max(self.peak[group], process.memory_info().rss)
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone since: its peak so far stands
                pass

    async def _run(self, interval: float) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)

    def __enter__(self) -> "Resources":
        self._task = asyncio.get_running_loop().create_task(self._run(0.1))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task:
            self._task.cancel()
        self.sample()

    def figures(self) -> dict[str, dict[str, float | None]]:
        out = {}
        for group, process in self.processes.items():
            start, end = self.cpu_start[group], self._cpu(process)
            out[group] = {
                "cpu_seconds": None if start is None or end is None else round(end - start, 3),
                "peak_rss_bytes": self.peak[group] or None,
                "gpu_memory_bytes": None,
            }
        return out


async def measure(
    address: str,
    workload: Workload,
    on_request: Callable[[], None],
    pids: dict[str, int],
    digests: dict[int, str],
    security: ClientSecurity | None = None,
) -> list[Row]:
    """The workload's rows against the daemon at `address`, dialled with `security` (default plaintext).

    Raises a RunFailed at the first run it cannot give figures for: Unreachable (the daemon stopped answering) or
    NoneSucceeded (every request of a run failed)."""
    client = GrpcClient(address, workload.options, security=security, voice=workload.voice)
    rows = []
    try:
        for _ in range(workload.warmup):
            await client.request(0, workload.texts[0])
            on_request()
        runs = [(None, workload.rate)] if workload.rate else [(c, None) for c in workload.concurrency]
        for concurrency, rate in runs:
            load = os.getloadavg()[0]
            where = f"c{concurrency}" if concurrency else f"{rate:g}/s"
            request = RefusalWatch(client.request, where).request
            with Resources(pids) as resources:
                if rate:
                    outcomes, wall = await open_loop(
                        request,
                        workload.texts,
                        rate,
                        requests=workload.requests,
                        duration=workload.duration,
                        progress=lambda n: on_request(),
                    )
                else:
                    outcomes, wall = await closed_loop(
                        request,
                        workload.texts,
                        concurrency or 1,
                        requests=workload.requests,
                        duration=workload.duration,
                        progress=lambda n: on_request(),
                    )
            if outcomes and all(o.error is not None for o in outcomes):
                raise NoneSucceeded(none_succeeded(outcomes, where))
            record_digests(outcomes, digests)
            summary = summarize(outcomes, wall)
            run = {**figures(summary), "load_average_1m": round(load, 2)}
            rows.append(Row(concurrency, rate, summary, resources.figures(), repeats=[run]))
    finally:
        await client.close()
    return rows


class RefusalWatch:
    """Ends a measured run with NoneSucceeded once REFUSALS_TO_GIVE_UP of its requests were refused and none has
    succeeded: each further request would be refused too, and a --duration run would go on sending them to its end.

    Only refusals count (REFUSED): a daemon that is busy (RESOURCE_EXHAUSTED), starting (UNAVAILABLE) or failing
    now and then (INTERNAL) may still serve the requests that follow, and a run that measures them is a run."""

    def __init__(self, request: Callable[[int, str], Awaitable[Outcome]], load: str) -> None:
        self._request = request
        self._load = load
        self._refused: list[Outcome] = []
        self._succeeded = False

    async def request(self, index: int, text: str) -> Outcome:
        outcome = await self._request(index, text)
        if outcome.error is None:
            self._succeeded = True
        elif outcome.error in REFUSED and not self._succeeded:
            self._refused.append(outcome)
            if len(self._refused) >= REFUSALS_TO_GIVE_UP:
                raise NoneSucceeded(
                    f"{none_succeeded(self._refused, self._load)}; the run stopped after {len(self._refused)} "
                    "refusals: the requests that follow would be refused too"
                )
        return outcome


def none_succeeded(outcomes: Sequence[Outcome], load: str) -> str:
    """What failed in a run without one successful request: the count per status code and the first one's message."""
    codes = ", ".join(f"{count} {code}" for code, count in Counter(o.error for o in outcomes).items())
    first = outcomes[0]
    return f"no request succeeded at {load} ({codes}); the first failed {first.error}: {first.detail}"


def record_digests(outcomes: Sequence[Outcome], digests: dict[int, str]) -> None:
    for outcome in outcomes:
        if outcome.error is None:
            digests.setdefault(outcome.text_index, outcome.digest)
