"""The daemon's events to its watchers (`stagevisor events`, the admin API's WatchEvents): each lifecycle or
condition event to every watcher, the most recent kept for a new one, and the end of every stream at shutdown.

A stuck watcher loses events rather than stalling the daemon.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Callable

from stagevisor.supervisor.daemon.lifecycle import LifecycleEvent

RECENT_EVENTS = 64
"""Lifecycle events a new `events` watcher gets first (the most recent)."""


class EventFeed:
    """The watchers of one daemon; `ended` says whether the daemon has stopped (a new watcher then gets the end)."""

    def __init__(self, ended: Callable[[], bool]) -> None:
        self._ended = ended
        self._subscribers: set[asyncio.Queue[LifecycleEvent | None]] = set()
        self._recent: collections.deque[LifecycleEvent] = collections.deque(maxlen=RECENT_EVENTS)

    def subscribe(self, history: bool = False) -> asyncio.Queue[LifecycleEvent | None]:
        """A queue of LifecycleEvents from now on (with `history`, the last RECENT_EVENTS first); None marks
        the end.

        History lets `stagevisor events` show how the groups got where they are instead of nothing
        until the next change. One loop, no await between the copy and the add: no event is missed
        or repeated.
        """
        queue: asyncio.Queue[LifecycleEvent | None] = asyncio.Queue(maxsize=10_000)
        for event in self._recent if history else ():
            queue.put_nowait(event)
        if self._ended():
            queue.put_nowait(None)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[LifecycleEvent | None]) -> None:
        self._subscribers.discard(queue)

    def publish(self, event: LifecycleEvent) -> None:
        """Send an event (a LifecycleEvent or a monitor's ConditionEvent) to every watcher; keep the recent ones."""
        self._recent.append(event)
        for queue in list(self._subscribers):
            if not queue.full():  # a stuck watcher loses events rather than stalling the daemon
                queue.put_nowait(event)

    def end(self) -> None:
        """End every watcher's stream: the daemon has stopped. A stuck watcher's full queue loses its oldest event
        to the end, so that its stream still ends and the shutdown goes on."""
        for queue in list(self._subscribers):
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(None)
