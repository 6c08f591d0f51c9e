"""Admission: slots, the FIFO queue, rejections with a retry hint, queue timeout, draining; no processes."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.dataplane.admission import (
    MAX_RETRY_AFTER,
    RESTART_RETRY_AFTER,
    START_ALLOWANCE,
    Admission,
    AdmissionLimits,
    AdmissionRejected,
)


def run(coro):
    return asyncio.run(coro)


def test_requests_beyond_running_and_queued_limits_are_rejected_busy_with_a_retry_hint():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=2, max_queued=1, queue_timeout=0))
        first, second = await admission.acquire(), await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        assert admission.queued == 1
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        assert (caught.value.status, caught.value.reason) == ("RESOURCE_EXHAUSTED", "BUSY")
        assert caught.value.retry_after >= 1 and "limit 2" in caught.value.message
        first.release()
        third = await asyncio.wait_for(waiting, 1)
        assert admission.running == 2 and admission.queued == 0
        second.release(), third.release(), third.release()  # release is idempotent
        assert admission.running == 0

    run(scenario())


def test_waiters_are_served_in_arrival_order():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=3, queue_timeout=0))
        slot = await admission.acquire()
        order: list[int] = []

        async def wait(n: int) -> None:
            granted = await admission.acquire()
            order.append(n)
            granted.release()

        tasks = [asyncio.ensure_future(wait(n)) for n in range(3)]
        await asyncio.sleep(0)
        slot.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert order == [0, 1, 2]

    run(scenario())


def test_a_queued_request_past_the_queue_timeout_is_rejected_and_leaves_the_queue():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=0.05))
        await admission.acquire()
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        assert caught.value.reason == "QUEUE_TIMEOUT" and caught.value.status == "RESOURCE_EXHAUSTED"
        assert admission.queued == 0 and admission.rejected["QUEUE_TIMEOUT"] == 1

    run(scenario())


def test_a_queue_timeout_of_0_lets_a_queued_request_wait_for_as_long_as_it_takes():
    """0 is no limit (--queue-timeout 0): a queued request waits until a slot frees, never timed out at once."""

    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=0))
        slot = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0.05)  # loop turns and some time: it is still queued, not rejected
        assert not waiting.done() and admission.queued == 1
        slot.release()
        granted = await asyncio.wait_for(waiting, 1)
        assert admission.running == 1 and admission.rejected.get("QUEUE_TIMEOUT", 0) == 0
        granted.release()

    run(scenario())


def test_a_client_cancelled_while_queued_frees_its_place():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=0))
        slot = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert admission.queued == 0
        slot.release()
        assert admission.running == 0
        again = await asyncio.wait_for(admission.acquire(), 1)
        assert admission.running == 1
        again.release()

    run(scenario())


def test_draining_rejects_queued_and_new_requests_unavailable_and_lets_running_ones_finish():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=2, queue_timeout=0))
        running = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        admission.drain()
        with pytest.raises(AdmissionRejected) as queued:
            await waiting
        with pytest.raises(AdmissionRejected) as new:
            await admission.acquire()
        assert {queued.value.status, new.value.status} == {"UNAVAILABLE"}
        assert new.value.reason == "DRAINING"
        assert admission.running == 1
        running.release()
        assert admission.running == 0

    run(scenario())


def test_while_the_daemon_starts_requests_are_refused_as_starting_with_a_retry_hint_then_admitted():
    """Before every worker is READY a request found no worker listening and failed as 'became unreachable'."""

    async def scenario():
        admission = Admission()
        admission.starting = True
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        refused = caught.value
        assert (refused.status, refused.reason, refused.retry_after) == ("UNAVAILABLE", "STARTING", 1)
        assert refused.message == "the daemon is starting: its workers are not all ready yet; retry in a few seconds"
        assert admission.rejected["STARTING"] == 1 and admission.running == 0
        admission.starting = False
        (await admission.acquire()).release()

    run(scenario())


def test_zero_concurrency_limit_means_unbounded():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=0, max_queued=0, queue_timeout=0))
        slots = [await admission.acquire() for _ in range(100)]
        assert admission.running == 100
        for slot in slots:
            slot.release()

    run(scenario())


def test_retry_after_grows_with_the_observed_service_time():
    now = [0.0]
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=0), clock=lambda: now[0])

    async def scenario():
        for _ in range(20):
            slot = await admission.acquire()
            now[0] += 10.0
            slot.release()
        return admission.retry_after()

    assert run(scenario()) == 10


@pytest.mark.parametrize(
    "kwargs", [{"max_concurrent": -1}, {"max_queued": -1}, {"queue_timeout": -1.0}, {"queue_timeout": float("nan")}]
)
def test_limits_reject_negative_or_non_finite_values(kwargs):
    with pytest.raises(ValueError):
        AdmissionLimits(**kwargs)


def test_while_a_group_has_failed_requests_are_refused_naming_it_and_the_restart_without_a_retry_hint():
    """A FAILED group (its restarts ran out) never serves again by itself, yet each request went to its dead address
    and failed as "became unreachable; retry", with nothing to say that no retry could pass."""

    async def scenario():
        admission = Admission()
        admission.failed_groups = ("vocoder",)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        refused = caught.value
        assert (refused.status, refused.reason, refused.retry_after) == ("UNAVAILABLE", "GROUP_FAILED", None)
        assert refused.message == (
            "process group 'vocoder' FAILED (its restarts ran out; `stagevisor status` shows why): no request can "
            "pass until an operator runs `stagevisor restart vocoder`; do not retry before"
        )
        assert admission.rejected["GROUP_FAILED"] == 1 and admission.running == 0
        admission.failed_groups = ()  # restarted
        (await admission.acquire()).release()

    run(scenario())


def test_while_a_group_restarts_with_no_worker_requests_are_refused_at_once_saying_when_to_retry():
    """A group with no worker taking requests while it restarts (a crash's backoff, `restart --force` stopping its
    worker): each request reached it and failed, or was taken by the stopping worker and cut when its grace ran
    out; now refused at admission, with the time its backoff ends plus the start allowance."""
    now = [100.0]

    async def scenario():
        admission = Admission(clock=lambda: now[0])
        admission.down_groups = ("pipeline",)
        admission.expect_restart(3.5)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        refused = caught.value
        assert (refused.status, refused.reason, refused.retry_after) == ("UNAVAILABLE", "GROUP_DOWN", 4)
        assert refused.message == (
            "process group 'pipeline' has no worker taking requests: it restarts (`stagevisor status` shows how "
            "far); retry in 4 s"
        )
        admission.failed_groups = ("vocoder",)  # a FAILED group is said first: no retry passes
        with pytest.raises(AdmissionRejected) as failed:
            await admission.acquire()
        assert failed.value.reason == "GROUP_FAILED"
        admission.failed_groups = admission.down_groups = ()  # back
        (await admission.acquire()).release()
        assert admission.rejected["GROUP_DOWN"] == 1

    run(scenario())


def test_a_request_failed_by_a_worker_going_down_retries_when_its_group_is_expected_back():
    """Before: no retry time at all (HTTP 503 without Retry-After); starting's refusals had one."""
    now = [0.0]
    admission = Admission(clock=lambda: now[0])
    assert admission.retry_after_unavailable() == RESTART_RETRY_AFTER  # no restart scheduled yet
    admission.expect_restart(4.0 + START_ALLOWANCE)  # a 4 s backoff left
    assert admission.retry_after_unavailable() == 5
    now[0] += 4.5
    assert admission.retry_after_unavailable() == 1
    now[0] += 10.0  # it takes longer than expected: retry soon, never at once
    assert admission.retry_after_unavailable() == 1
    admission.expect_restart(1000.0)
    assert admission.retry_after_unavailable() == MAX_RETRY_AFTER
    admission.expect_restart(None)
    assert admission.retry_after_unavailable() == RESTART_RETRY_AFTER
