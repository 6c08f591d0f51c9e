"""RequestHandle: one request in flight as its caller sees it, the chunks the terminal stages stream, in order.

The gateway fills it (`push`, `finish_branch`, `fail`) from the frames workers send; the caller iterates it and
closes it, which hands it back to the gateway through the small `HandleOwner` seam.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncIterator, Callable, Protocol

from stagevisor.supervisor.dataplane.admission import Slot
from stagevisor.supervisor.errors import RequestFailed

Event = tuple[str, Any, Callable[[], None] | None]
"""("chunk", chunk, its credit), ("end", None, None) or ("error", RequestFailed, None)."""


class HandleOwner(Protocol):
    """What a RequestHandle asks of the gateway that opened it."""

    def close_request(self, handle: RequestHandle) -> None:
        """Take the handle off the gateway's books; cancel the request everywhere if it has not ended."""

    def cancel_everywhere(self, request_id: str, reason: str) -> None:
        """Tell every worker on the route to stop the request (it failed here)."""

    def retry_after_unavailable(self) -> int:
        """Seconds a request that failed UNAVAILABLE should wait before it retries (Admission's estimate)."""


class RequestHandle:
    """One request in flight: iterate it for the terminal stages' chunks, in order.

    Iteration ends when every terminal stage on the route is done and raises
    RequestFailed when the request fails anywhere. `close()` (always call it,
    e.g. in a finally) cancels the request in every worker if it has not ended.
    """

    def __init__(
        self, gateway: HandleOwner, request_id: str, expected_done: int, idle_timeout: float | None = None
    ) -> None:
        self.request_id = request_id
        self.idle_timeout = idle_timeout
        """Seconds the pipeline may send this request nothing before it fails UNAVAILABLE (None: no limit)."""
        self._gateway = gateway
        self._expected_done = expected_done
        self._done = 0
        # Events in arrival order, and the future the iterator sleeps on while there are none: one
        # future and one timer per wait, no task per chunk (this runs for every chunk of every request).
        self._events: deque[Event] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        """The idle timeout of the wait in progress (None between waits, or without a timeout)."""
        self.ended = False
        self.hops: set[tuple[str, str, str]] = set()
        self.timings: list[tuple[str, float, float]] = []
        """(name, start, end) of every finished branch's trace (metrics on): the request's stage timings."""
        self.links: set[Any] = set()
        """The gateway's links to the workers on the route when the request started."""
        self.slot: Slot | None = None
        """Its admission slot (requests entered through `submit`), freed when the handle closes."""
        self.replica: str | None = None
        """The replica of a replicated entry group the request went to (None: a single worker)."""
        self.handed_to: frozenset[str] = frozenset()
        """Replicas a worker that has since stopped routed the request to (its HandedOn frame): no live sender
        knows it went there, so the gateway fails it should one of them be lost."""
        self.sample_rate = 0
        """The rate of the request's first audio chunk (0 before it): the rate every later chunk must have."""

    def _put(self, event: Event) -> None:
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def push(self, chunk: Any, ack: Callable[[], None]) -> None:
        """A terminal stage's chunk, with the credit to return once the caller took it (the gateway's)."""
        if not self.ended:
            self._put(("chunk", chunk, ack))
        else:
            ack()

    def finish_branch(self, hops: tuple[tuple[str, str, str], ...]) -> bool:
        """A terminal stage finished its branch (the gateway's); True when that ended the request."""
        self.hops.update(hops)
        self._done += 1
        if self._done >= self._expected_done and not self.ended:
            self.ended = True
            self._put(("end", None, None))
            return True
        return False

    def fail(self, status: str, message: str, stage: str = "", *, code: str = "", field: str = "") -> bool:
        """End the request with RequestFailed (the gateway's), `code` the stage's own and `field` the request field
        it names; False when it had already ended."""
        if self.ended:
            return False
        self.ended = True
        # A worker on the route went down (or stopped): the client retries once it is expected back.
        retry_after = self._gateway.retry_after_unavailable() if status == "UNAVAILABLE" else None
        failed = RequestFailed(
            status, message, stage=stage, request_id=self.request_id, code=code, field=field, retry_after=retry_after
        )
        self._put(("error", failed, None))
        return True

    def _idle_expired(self) -> None:
        message = (
            f"the pipeline sent nothing for this request for {self.idle_timeout:g} s: a worker on its route cannot "
            "answer; retry"
        )
        if self.fail("UNAVAILABLE", message):
            # Workers that are alive would go on making it for nobody, holding their capacity.
            self._gateway.cancel_everywhere(self.request_id, message)

    def keep_alive(self) -> None:
        """A worker still holds the request and works on it (the gateway's): the idle timeout starts again."""
        timer = self._timer
        if timer is not None and self.idle_timeout is not None:
            timer.cancel()
            self._timer = asyncio.get_running_loop().call_later(self.idle_timeout, self._idle_expired)

    async def _next_event(self) -> Event:
        """The next event, waiting up to `idle_timeout` for one, or since a worker last said it holds the request
        (`keep_alive`); then the request fails UNAVAILABLE."""
        if not self._events:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            if self.idle_timeout is not None:
                self._timer = loop.call_later(self.idle_timeout, self._idle_expired)
            try:
                await waiter
            finally:
                self._waiter = None
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
        return self._events.popleft()

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            kind, value, ack = await self._next_event()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
            # Credit only once the consumer asked for more: a slow client slows the vocoder.
            assert ack is not None, "a chunk event carries its credit"
            ack()

    def close(self) -> None:
        self._gateway.close_request(self)
        self._discard_queued()

    def _discard_queued(self) -> None:
        # Chunks the client never read: return their credits and let go of their buffers now.
        while self._events:
            kind, _, ack = self._events.popleft()
            if kind == "chunk" and ack is not None:
                ack()
