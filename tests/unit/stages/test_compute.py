"""DeadlinePool: earliest deadline first, cancellation before start, errors to the caller, threads, sizing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from stagevisor.stages import compute
from stagevisor.stages.compute import DeadlinePool

WAIT = 10.0  # seconds; bounds every wait on a thread of the pool


def blocked(pool: DeadlinePool) -> threading.Event:
    """Occupy the pool's (only) thread until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        assert release.wait(WAIT)

    pool.submit(0.0, hold)
    assert started.wait(WAIT)
    return release


def test_queued_calls_run_earliest_deadline_first_and_in_submission_order_on_ties():
    pool = DeadlinePool(1)
    release = blocked(pool)
    ran: list[str] = []
    futures = [
        pool.submit(deadline, ran.append, name)
        for deadline, name in ((3.0, "c"), (1.0, "a1"), (2.0, "b"), (1.0, "a2"), (0.5, "first"))
    ]
    assert pool.queued() == 5
    release.set()
    for future in futures:
        future.result(WAIT)
    assert ran == ["first", "a1", "a2", "b", "c"]


def test_a_call_cancelled_before_it_starts_never_runs():
    pool = DeadlinePool(1)
    release = blocked(pool)
    ran: list[str] = []
    dropped = pool.submit(1.0, ran.append, "dropped")
    kept = pool.submit(2.0, ran.append, "kept")
    assert dropped.cancel()
    release.set()
    kept.result(WAIT)
    assert ran == ["kept"] and dropped.cancelled()


def test_cancelling_the_awaiting_task_drops_a_queued_call():
    pool = DeadlinePool(1)
    release = blocked(pool)
    ran: list[str] = []

    async def scenario() -> None:
        task = asyncio.ensure_future(pool.run(1.0, ran.append, "dropped"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.wait_for(pool.run(2.0, ran.append, "after"), WAIT)

    asyncio.run(scenario())
    assert ran == ["after"]


def test_a_calls_error_reaches_its_caller_and_the_pool_keeps_serving():
    pool = DeadlinePool(1)

    def fail() -> None:
        raise ValueError("bad window")

    async def scenario() -> int:
        with pytest.raises(ValueError, match="bad window"):
            await asyncio.wait_for(pool.run(0.0, fail), WAIT)
        return await asyncio.wait_for(pool.run(0.0, sum, [1, 2]), WAIT)

    assert asyncio.run(scenario()) == 3


def test_the_pool_runs_as_many_calls_at_once_as_it_has_threads_and_starts_them_on_first_use():
    pool = DeadlinePool(2, name="test-compute")
    assert not [t for t in threading.enumerate() if t.name.startswith("test-compute")]
    both = threading.Barrier(2, timeout=WAIT)  # broken (an error) unless two calls run at the same time
    futures = [pool.submit(0.0, both.wait) for _ in range(2)]
    assert sorted(f.result(WAIT) for f in futures) == [0, 1]
    assert len([t for t in threading.enumerate() if t.name.startswith("test-compute")]) == 2


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError, match="at least one thread"):
        DeadlinePool(0)


def test_the_process_pool_has_a_thread_per_usable_core_unless_the_operator_sets_it(monkeypatch):
    import os

    monkeypatch.delenv(compute.THREADS_ENV, raising=False)
    assert compute._threads_from_env() == len(os.sched_getaffinity(0))
    monkeypatch.setenv(compute.THREADS_ENV, "3")
    assert compute._threads_from_env() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(compute.THREADS_ENV, bad)
        with pytest.raises(ValueError, match=f"{compute.THREADS_ENV} must be a whole number >= 1, got '{bad}'"):
            compute._threads_from_env()
