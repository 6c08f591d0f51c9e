"""The idle rule of a write that waits on its client: idle means no progress for the whole --stream-idle-timeout.

Before: each write had to complete within the timeout, and one write can wait for megabytes of socket buffer to
drain, so a client reading 20 KB/s all along was cut after 60 s as if it read nothing. Readings here are fakes;
the waits are milliseconds (the poll interval is given).
"""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.supervisor.dataplane.limits import (
    PROGRESS_POLL,
    LimitExceeded,
    ReadProgress,
    RequestGuard,
    RequestLimits,
)
from tests.fakes import FakeBacklog

IDLE = 0.05
POLL = 0.005


def test_a_lower_reading_is_progress_and_starts_the_idle_time_again():
    progress = ReadProgress(10.0, now=0.0, backlog=5000)
    assert progress.observe(4.0, 4000)
    assert progress.idle_at == 14.0


@pytest.mark.parametrize("reading", [5000, 6000, None], ids=["the same", "higher", "unknown"])
def test_a_reading_that_did_not_fall_is_no_progress(reading):
    """A higher reading is more written (a WebSocket ping), not more read."""
    progress = ReadProgress(10.0, now=0.0, backlog=5000)
    assert not progress.observe(4.0, reading)
    assert progress.idle_at == 10.0


def test_an_unknown_reading_keeps_the_one_before_to_compare_the_next_with():
    progress = ReadProgress(10.0, now=0.0, backlog=5000)
    progress.observe(1.0, None)
    assert progress.observe(2.0, 4999)


def test_the_first_known_reading_is_no_progress_yet():
    progress = ReadProgress(10.0, now=0.0, backlog=None)
    assert not progress.observe(1.0, 100)
    assert progress.observe(2.0, 99)


def test_the_backlog_is_read_every_second_or_four_times_per_idle_timeout():
    async def run():
        return (
            RequestGuard(RequestLimits(stream_idle_timeout=60)).poll_interval,
            RequestGuard(RequestLimits(stream_idle_timeout=2)).poll_interval,
        )

    assert asyncio.run(run()) == (PROGRESS_POLL, 0.5)


async def write_done_after(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "sent"


def test_a_write_that_waits_past_the_idle_timeout_on_a_client_still_reading_completes():
    """
    1. a write takes four idle timeouts to leave (a slow reader behind a full socket buffer)
    2. its client takes bytes between every two readings
    3. the write completes; the request is not cut
    """

    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=IDLE), poll_interval=POLL)
        return await guard.send(write_done_after(4 * IDLE), FakeBacklog.falling(10_000))

    assert asyncio.run(run()) == "sent"


def test_a_client_that_stops_reading_is_cut_an_idle_timeout_after_its_last_progress():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=IDLE, request_timeout=60), poll_interval=POLL)
        backlog = FakeBacklog.falling(5)
        stuck = asyncio.get_running_loop().create_future()
        with pytest.raises(LimitExceeded) as caught:
            await guard.send(stuck, backlog)
        assert caught.value.stalled_write is stuck and not stuck.done()  # left to the caller, as before
        stuck.cancel()
        return caught.value, backlog.taken

    error, taken = asyncio.run(run())
    assert error.status == "DEADLINE_EXCEEDED"
    assert "read no audio for 0.05 s (--stream-idle-timeout)" in error.message
    assert taken > 6  # the five falls were seen, and then readings that did not fall for an idle timeout


def test_a_client_whose_backlog_never_falls_is_cut_at_the_idle_timeout():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=IDLE, request_timeout=60), poll_interval=POLL)
        stuck = asyncio.get_running_loop().create_future()
        with pytest.raises(LimitExceeded, match="--stream-idle-timeout"):
            await guard.send(stuck, FakeBacklog(70_000))
        stuck.cancel()

    asyncio.run(run())


def test_a_backlog_that_cannot_be_read_bounds_the_write_as_a_whole_as_before():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=IDLE, request_timeout=60), poll_interval=POLL)
        with pytest.raises(LimitExceeded, match="--stream-idle-timeout"):
            await guard.send(write_done_after(20 * IDLE), FakeBacklog(None))

    asyncio.run(run())


def test_a_client_still_reading_at_the_request_deadline_is_cut_by_the_deadline():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=IDLE, request_timeout=4 * IDLE), poll_interval=POLL)
        stuck = asyncio.get_running_loop().create_future()
        with pytest.raises(LimitExceeded) as caught:
            await guard.send(stuck, FakeBacklog.falling(100_000))
        stuck.cancel()
        return caught.value

    error = asyncio.run(run())
    assert "--request-timeout" in error.message and error.stalled_write is not None


def test_a_cancelled_request_cancels_its_write_while_its_backlog_is_watched():
    async def run():
        guard = RequestGuard(RequestLimits(), poll_interval=POLL)
        stuck = asyncio.get_running_loop().create_future()
        sending = asyncio.create_task(guard.send(stuck, FakeBacklog(70_000)))
        await asyncio.sleep(3 * POLL)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        return stuck.cancelled()

    assert asyncio.run(run())
