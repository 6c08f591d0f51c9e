"""A local worker's heartbeats as the daemon reads them (daemon/process_worker.py's Heartbeats), on a socket pair.

No process: the test writes the bytes a worker's event loop would. Every wait is bounded; the intervals are
wide enough that a loaded machine delays nothing past them.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from stagevisor.supervisor.daemon.handle import SILENT_BEATS, heartbeat_interval, silence_limit
from stagevisor.supervisor.daemon.process_worker import Heartbeats
from tests.fakes import poll_until


def run(scenario) -> None:
    asyncio.run(scenario())


@pytest.mark.parametrize("timeout, limit", [(0, 0.0), (10, 3.0), (2, 1.5), (0.4, 0.3)])
def test_a_worker_is_silent_after_three_missed_beats_well_before_its_timeout(timeout, limit):
    assert silence_limit(timeout) == pytest.approx(limit) == pytest.approx(SILENT_BEATS * heartbeat_interval(timeout))
    assert silence_limit(timeout) < timeout or timeout == 0


def test_silence_is_reported_only_once_the_beats_stop_and_counts_from_the_last_one():
    """
    1. a worker beats every 50 ms for 0.6 s: a watcher for 0.4 s of silence waits through all of it;
    2. once the beats stop it returns, with a silence of at least 0.4 s.
    """

    async def scenario():
        ours, worker = socket.socketpair()
        beats = Heartbeats(ours.fileno(), asyncio.get_running_loop())

        async def beat() -> None:
            for _ in range(12):
                worker.send(b"\0")
                await asyncio.sleep(0.05)

        beating = asyncio.create_task(beat())
        silence = await asyncio.wait_for(beats.silent_for(0.4), 10)
        assert beating.done() and silence >= 0.4
        beats.close()
        ours.close()
        worker.close()

    run(scenario)


def test_the_next_beat_wakes_every_waiter_and_a_beat_unread_while_the_loop_was_late_still_counts():
    async def scenario():
        ours, worker = socket.socketpair()
        beats = Heartbeats(ours.fileno(), asyncio.get_running_loop())
        waiters = [asyncio.create_task(beats.next_beat()) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiters)
        worker.send(b"\0")
        await asyncio.wait_for(asyncio.gather(*waiters), 10)

        worker.send(b"\0")
        time.sleep(0.3)  # this loop is late: the beat sits unread past the silence asked for
        watcher = asyncio.create_task(beats.silent_for(0.2))
        await asyncio.sleep(0.05)
        assert not watcher.done()  # it read the beat first: silent only 0.2 s after it
        assert await asyncio.wait_for(watcher, 10) >= 0.2
        beats.close()
        ours.close()
        worker.close()

    run(scenario)


def test_once_the_worker_is_gone_nothing_returns_any_more():
    """EOF on the lifeline: the worker exited, and its exit, not a missed beat, tells the story."""

    async def scenario():
        ours, worker = socket.socketpair()
        beats = Heartbeats(ours.fileno(), asyncio.get_running_loop())
        silent, beat = asyncio.create_task(beats.silent_for(0.1)), asyncio.create_task(beats.next_beat())
        worker.close()
        assert await poll_until(lambda: beats.closed)
        # What must not happen: a short sleep past the 0.1 s of silence asked for, in which a silent_for or a
        # next_beat that returned after EOF would be done.
        await asyncio.sleep(0.3)
        assert not silent.done() and not beat.done()
        silent.cancel()
        beat.cancel()
        await asyncio.gather(silent, beat, return_exceptions=True)
        ours.close()

    run(scenario)


def test_a_watch_cancelled_as_a_beat_arrives_ends_cancelled_and_does_not_wait_on():
    """
    1. a watcher waits for 10 s of silence; a beat is read, and in the same loop turn the watcher is cancelled
       (the runner's watch ends: the worker was stopped or died as it beat);
    2. it ends cancelled. It swallowed the cancel (asyncio.wait_for returns the result of a future done by the
       time the cancel is handled) and waited on, for good once the worker was gone, until the garbage collector
       destroyed it pending ("Task was destroyed but it is pending!" in the daemon's log, after a scale down).
    """

    async def scenario():
        ours, worker = socket.socketpair()
        beats = Heartbeats(ours.fileno(), asyncio.get_running_loop())
        watcher = asyncio.create_task(beats.silent_for(10.0))
        await asyncio.sleep(0.05)
        worker.send(b"\0")
        beats.read()  # the beat, read in this turn: the future it waits on is done before the cancel is handled
        watcher.cancel()
        await asyncio.wait({watcher}, timeout=5.0)
        done = watcher.done()
        if not done:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        beats.close()
        ours.close()
        worker.close()
        return done and watcher.cancelled()

    assert asyncio.run(scenario())
