"""Admission at its boundaries: the limits' bounds, the retry hint, rejection messages and counts, races."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from stagevisor.supervisor.dataplane import admission as module
from stagevisor.supervisor.dataplane.admission import MAX_RETRY_AFTER, Admission, AdmissionLimits, AdmissionRejected
from tests.fakes import FakeClock


def run(coro):
    return asyncio.run(coro)


def test_the_default_limits_are_32_running_128_queued_and_30_seconds_of_waiting():
    assert AdmissionLimits() == AdmissionLimits(max_concurrent=32, max_queued=128, queue_timeout=30.0)
    assert MAX_RETRY_AFTER == 60


@pytest.mark.parametrize("kwargs", [{"max_concurrent": 0}, {"max_queued": 0}, {"queue_timeout": 0.0}])
def test_zero_is_a_valid_limit(kwargs):
    AdmissionLimits(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_concurrent": -1}, "max_concurrent must be >= 0 (0 = unbounded)"),
        ({"max_queued": -1}, "max_queued must be >= 0 (0 = no queue)"),
        ({"queue_timeout": -0.001}, "queue_timeout must be a finite number of seconds >= 0 (0 = no limit)"),
        ({"queue_timeout": float("inf")}, "queue_timeout must be a finite number"),
    ],
)
def test_a_limit_out_of_range_says_which_and_what_zero_means(kwargs, message):
    with pytest.raises(ValueError) as caught:
        AdmissionLimits(**kwargs)
    assert str(caught.value) == message or str(caught.value).startswith(message)


def served(admission: Admission, clock: FakeClock, seconds: float) -> None:
    """One request that takes `seconds` in the pipeline."""

    async def one():
        slot = await admission.acquire()
        clock.advance(seconds)
        slot.release()

    run(one())


@pytest.mark.parametrize(
    "service, max_concurrent, expected",
    [
        (11.0, 1, 3),  # mean service 0.8 * 1 + 0.2 * 11 = 3 s, one slot
        (11.0, 2, 2),  # 3 s over two slots: 1.5, rounded up
        (11.0, 0, 3),  # unbounded: counted as one slot
        (0.0, 1, 1),  # 0.8 s rounds up to the 1 s floor
        (1000.0, 1, MAX_RETRY_AFTER),  # capped
    ],
)
def test_the_retry_hint_is_the_mean_service_time_per_slot_rounded_up_between_1_and_60(
    service, max_concurrent, expected
):
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=max_concurrent, max_queued=0), clock=clock)
    served(admission, clock, service)
    assert admission.retry_after() == expected


def test_the_retry_hint_counts_the_queue_ahead_of_a_newcomer():
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=4, queue_timeout=0), clock=clock)
    served(admission, clock, 11.0)  # mean 3 s

    async def scenario():
        slot = await admission.acquire()
        waiters = [asyncio.ensure_future(admission.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        hint = admission.retry_after()
        admission.drain()
        await asyncio.gather(*waiters, return_exceptions=True)
        slot.release()
        return hint

    assert run(scenario()) == 9  # (2 queued + the newcomer) x 3 s


def test_a_release_before_the_start_counts_as_no_time():
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=0), clock=clock)
    served(admission, clock, -50.0)  # a clock that stepped back
    assert admission.retry_after() == 1


def test_a_busy_rejection_names_both_limits_and_counts():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=0, queue_timeout=0))
        slot = await admission.acquire()
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        slot.release()
        return admission, caught.value

    admission, rejected = run(scenario())
    assert rejected.message == "the daemon is busy: 1 request running (limit 1) and 0 queued (limit 0); retry later"
    assert admission.rejected == {
        "BUSY": 1,
        "QUEUE_TIMEOUT": 0,
        "DRAINING": 0,
        "STARTING": 0,
        "GROUP_FAILED": 0,
        "GROUP_DOWN": 0,
    }


def test_a_queue_timeout_rejection_says_how_long_it_waited():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=0.05))
        slot = await admission.acquire()
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire()
        slot.release()
        return admission, caught.value

    admission, rejected = run(scenario())
    assert (rejected.status, rejected.reason) == ("RESOURCE_EXHAUSTED", "QUEUE_TIMEOUT")
    assert rejected.message == "the request waited 0.05s in the queue without getting a slot (1 running); retry later"
    assert admission.rejected["QUEUE_TIMEOUT"] == 1 and admission.queued == 0


def test_a_draining_rejection_is_unavailable_with_a_retry_hint_and_counted():
    admission = Admission()
    admission.drain()
    with pytest.raises(AdmissionRejected) as caught:
        run(admission.acquire())
    assert (caught.value.status, caught.value.reason) == ("UNAVAILABLE", "DRAINING")
    assert caught.value.retry_after == 1 and "shutting down" in caught.value.message
    assert admission.rejected["DRAINING"] == 1


def test_a_slot_granted_in_the_instant_the_wait_timed_out_is_kept(monkeypatch):
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=5))
        held = await admission.acquire()
        real_wait = asyncio.wait

        async def wait(futures, timeout):
            held.release()  # the slot frees and goes to the waiter...
            return set(), set(futures)  # ...in the same instant its wait times out

        monkeypatch.setattr(module.asyncio, "wait", wait)
        slot = await admission.acquire()
        monkeypatch.setattr(module.asyncio, "wait", real_wait)
        assert admission.running == 1 and admission.rejected["QUEUE_TIMEOUT"] == 0
        slot.release()
        assert admission.running == 0

    run(scenario())


def test_a_client_gone_in_the_instant_its_slot_was_granted_hands_the_slot_on():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=2, queue_timeout=0))
        held = await admission.acquire()
        leaving = asyncio.ensure_future(admission.acquire())
        staying = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        leaving.cancel()
        held.release()  # granted to the leaving client before its cancellation runs
        await asyncio.gather(leaving, return_exceptions=True)
        slot = await asyncio.wait_for(staying, 1)
        assert leaving.cancelled() and admission.running == 1 and admission.queued == 0
        slot.release()
        assert admission.running == 0

    run(scenario())


def test_the_snapshot_reports_limits_counts_and_rejections():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=2, max_queued=3, queue_timeout=4.5))
        slot = await admission.acquire()
        snapshot = admission.snapshot()
        slot.release()
        return snapshot

    assert run(scenario()) == {
        "running": 1,
        "queued": 0,
        "draining": False,
        "max_concurrent": 2,
        "max_queued": 3,
        "queue_timeout": 4.5,
        "rejected": {"BUSY": 0, "QUEUE_TIMEOUT": 0, "DRAINING": 0, "STARTING": 0, "GROUP_FAILED": 0, "GROUP_DOWN": 0},
    }


def test_admission_limits_are_immutable_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdmissionLimits().max_queued = 1  # type: ignore[misc]


def hint_with_queue(admission: Admission, queued: int) -> int:
    """The retry hint a newcomer gets behind one running request and `queued` waiting ones."""

    async def scenario():
        slot = await admission.acquire()
        waiters = [asyncio.ensure_future(admission.acquire()) for _ in range(queued)]
        await asyncio.sleep(0)
        hint = admission.retry_after()
        admission.drain()
        await asyncio.gather(*waiters, return_exceptions=True)
        slot.release()
        return hint

    return run(scenario())


def test_a_release_before_the_start_adds_zero_seconds_to_the_mean_service_time():
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=16, queue_timeout=0), clock=clock)
    served(admission, clock, -50.0)  # mean 0.8 * 1 + 0.2 * 0 = 0.8 s
    assert hint_with_queue(admission, 9) == 8  # (9 queued + the newcomer) x 0.8 s


def test_a_request_shorter_than_a_second_adds_its_own_time_to_the_mean_service_time():
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=16, queue_timeout=0), clock=clock)
    served(admission, clock, 0.2)  # mean 0.8 * 1 + 0.2 * 0.2 = 0.84 s
    assert hint_with_queue(admission, 9) == 9  # 10 x 0.84 = 8.4, rounded up


def test_the_retry_hint_is_one_second_even_when_the_estimate_rounds_to_nothing():
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_concurrent=8, max_queued=0), clock=clock)

    async def instantaneous(count: int) -> None:
        for _ in range(count):
            (await admission.acquire()).release()

    run(instantaneous(4000))  # the mean service time decays to the smallest float; / 8 slots it is 0.0
    assert admission.retry_after() == 1


def test_a_client_cancelled_while_queued_sees_its_own_cancellation():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=0))
        slot = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        slot.release()
        return waiting.cancelled(), admission.running, admission.queued

    assert run(scenario()) == (True, 0, 0)


def test_a_snapshot_keeps_the_counts_of_its_moment():
    admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=0))
    admission.reject("BUSY")
    snapshot = admission.snapshot()
    admission.reject("BUSY")
    admission.drain()
    assert (
        snapshot["rejected"]
        == {"BUSY": 1, "QUEUE_TIMEOUT": 0, "DRAINING": 0, "STARTING": 0, "GROUP_FAILED": 0, "GROUP_DOWN": 0}
        and snapshot["draining"] is False
    )
    assert admission.snapshot()["rejected"]["BUSY"] == 2


def test_each_queued_request_a_drain_turns_away_is_counted_as_a_draining_rejection():
    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=4, queue_timeout=0))
        running = await admission.acquire()
        waiting = [asyncio.ensure_future(admission.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        admission.drain()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        running.release()
        return [(r.status, r.reason) for r in results], dict(admission.rejected)

    results, rejected = run(scenario())
    assert results == [("UNAVAILABLE", "DRAINING")] * 2
    assert rejected == {"BUSY": 0, "QUEUE_TIMEOUT": 0, "DRAINING": 2, "STARTING": 0, "GROUP_FAILED": 0, "GROUP_DOWN": 0}


@pytest.mark.parametrize("turns", range(5))
def test_a_client_cancelled_just_after_its_slot_was_granted_holds_no_slot(turns):
    """A queued request is granted a slot, and its caller is cancelled `turns` loop turns later (an HTTP client
    gone while queued: `unless_disconnected` cancels the submission and drops whatever it returns). Whatever the
    moment, a cancelled acquire raises CancelledError and gives the slot back: a slot returned to a caller that
    was cancelled is never released, and after max_concurrent of them the daemon admits nothing."""

    async def scenario():
        admission = Admission(AdmissionLimits(max_concurrent=1, max_queued=1, queue_timeout=30))
        held = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0)
        held.release()  # granted to the waiter...
        for _ in range(turns):
            await asyncio.sleep(0)
        if waiting.done():  # ...which already has it: its caller releases it as usual
            waiting.result().release()
        else:  # ...whose caller is cancelled before it resumed
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            assert waiting.cancelled(), "a cancelled acquire returned a slot its caller will never release"
        return admission.running, admission.queued

    assert run(scenario()) == (0, 0)
