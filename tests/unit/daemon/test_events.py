"""EventFeed: every watcher gets each event, a new one the recent history, and every stream its end."""

from __future__ import annotations

from stagevisor.supervisor.daemon.events import RECENT_EVENTS, EventFeed
from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent


def event(index: int) -> LifecycleEvent:
    return LifecycleEvent("g0", GroupState.STARTING, GroupState.READY, 100 + index, f"event {index}", float(index))


def drain(queue):
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def test_a_new_watcher_gets_the_recent_events_with_history_and_then_every_new_one():
    feed = EventFeed(ended=lambda: False)
    for index in range(RECENT_EVENTS + 3):
        feed.publish(event(index))
    with_history, without = feed.subscribe(history=True), feed.subscribe()
    feed.publish(event(999))
    assert [e.pid for e in drain(with_history)] == [100 + i for i in range(3, RECENT_EVENTS + 3)] + [1099]
    assert [e.pid for e in drain(without)] == [1099]


def test_a_watcher_that_subscribes_after_the_daemon_stopped_gets_the_end_at_once():
    feed = EventFeed(ended=lambda: True)
    assert drain(feed.subscribe()) == [None]


def test_a_stuck_watchers_full_queue_still_gets_its_end_and_the_shutdown_goes_on():
    feed = EventFeed(ended=lambda: False)
    stuck, live = feed.subscribe(), feed.subscribe()
    for index in range(stuck.maxsize + 5):  # nobody reads `stuck`: it fills, and later events are lost to it
        feed.publish(event(index))
        drain(live)
    feed.end()  # raised QueueFull here, out of the daemon's shutdown, before the fix
    events = drain(stuck)
    assert events[-1] is None and len(events) == stuck.maxsize
    assert events[0].pid == 101  # the oldest event made room for the end
    assert drain(live) == [None]
