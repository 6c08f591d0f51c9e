"""Blocking compute run in deadline order: the earliest-needed work gets the next free core.

With `asyncio.to_thread`, every request's calls share the default executor
first come, first served, and as many as it has threads time-slice the
cores. A stream that has started playing then waits behind work whose audio
is needed later (a newer request's whole sentence, another stream's far
window) and falls behind real time: at concurrency 8 on two cores every
demo request paused, about a second each (tests/benchmarks/bench_piper.py,
`stall`). `DeadlinePool` runs each call when a thread is free, the one with
the earliest deadline first (ties in submission order), on as many threads
as the process has cores, so a call runs at a core's speed once started.

A deadline is a `time.monotonic()` instant: when the call's result is
needed. Stages derive it from playback (see stages/piper/executors.py): a stream's
next window is needed when the audio already sent to the client has played.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import heapq
import itertools
import os
import threading
from typing import Any, Callable, TypeVar

import stagevisor.supervisor.envs as envs

T = TypeVar("T")

THREADS_ENV = envs.COMPUTE_THREADS.name
"""Threads of the process's pool (default: the cores this process may run on)."""


class DeadlinePool:
    """A fixed set of threads that take queued calls earliest deadline first.

    Calls are not preempted: one that has started runs to its end. A call
    whose future is cancelled before it starts is dropped. Threads start on
    the first submission and are daemons; a process forked after that starts
    its own on its first submission (a fork copies none of them).
    """

    def __init__(self, threads: int, name: str = "compute") -> None:
        if threads < 1:
            raise ValueError(f"a DeadlinePool needs at least one thread, got {threads}")
        self.threads = threads
        self._name = name
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: list[tuple[float, int, concurrent.futures.Future, Callable[[], Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._started = 0

    def submit(self, deadline: float, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future:
        """Queue fn(*args) to run when a thread is free and nothing queued has an earlier deadline."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._pid != os.getpid():  # forked: the parent's threads and queue are not this process's
            self._reset()
        with self._ready:
            heapq.heappush(self._queue, (deadline, next(self._order), future, functools.partial(fn, *args)))
            while self._started < self.threads:
                self._started += 1
                threading.Thread(target=self._serve, name=f"{self._name}-{self._started}", daemon=True).start()
            self._ready.notify()
        return future

    async def run(self, deadline: float, fn: Callable[..., T], *args: Any) -> T:
        """submit() awaited: cancelling the awaiting task drops the call if it has not started."""
        return await asyncio.wrap_future(self.submit(deadline, fn, *args))

    def queued(self) -> int:
        with self._ready:
            return len(self._queue)

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                _, _, future, call = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting task, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, call  # nothing of a finished call stays alive while this thread waits


def threads_from_env(var: envs.EnvVar, default: int) -> int:
    """A thread count from the environment variable `var` (`default` where unset or blank).

    Raises ValueError naming the variable for anything but a whole number >= 1.
    """
    name = var.name
    raw = var.get().strip()
    if not raw:
        return default
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {raw!r}")
    return threads


def _threads_from_env() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return threads_from_env(envs.COMPUTE_THREADS, cores)


@functools.lru_cache(maxsize=1)
def compute_pool() -> DeadlinePool:
    """The process's pool, sized by STAGEVISOR_COMPUTE_THREADS or the cores it may run on."""
    return DeadlinePool(_threads_from_env())
