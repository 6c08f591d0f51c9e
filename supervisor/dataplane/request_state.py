"""What a worker holds for each in-flight request, and the bounded table of them.

At most `max_requests` requests are held at once (a frame that would open one
more is refused, as is one that would give a single peer more than its share,
limits.per_peer_cap), and a request whose stage waits on a stream that has been
silent for `stream_idle_timeout` seconds (its sender is gone, or it never
existed) is failed and forgotten. A cancelled request's id is remembered for a
while, so its late frames are dropped instead of opening it again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Iterable, Protocol

from stagevisor.stages.base import StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.limits import per_peer_cap
from stagevisor.supervisor.dataplane.link.outbound import OutboundLink
from stagevisor.supervisor.dataplane.link.server import InboundLink
from stagevisor.supervisor.dataplane.streams import ChunkQueue, CreditWindow
from stagevisor.supervisor.dataplane.trace import Span

MAX_REQUESTS = 4096
"""Requests one worker holds state for at once; frames of further requests are refused."""
STREAM_IDLE_TIMEOUT = 300.0
"""Seconds a stage may wait on an inbound stream that receives nothing before its request fails."""
KEEP_ALIVE_INTERVAL = 5.0
"""Seconds between a worker's words to the gateway that it still holds its requests (`keep_alive`): well under
the gateway's --pipeline-idle-timeout (120 s by default), which fails only requests no worker holds."""
RECENT_CANCELS = 4096
"""Ids of cancelled (or refused) requests remembered, so their late frames are dropped quietly."""
RECENT_FINISHED = 8192
"""Ids of requests whose work here ended remembered, for the gateway as this worker stops (`finished`)."""


@dataclass
class RequestState:
    """What one worker holds for one in-flight request."""

    request_id: str
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    inbound: dict[tuple[str, str], ChunkQueue] = field(default_factory=dict)
    stream_payloads: dict[tuple[str, str], StagePayload] = field(default_factory=dict)
    """The payload of the stage reading each inbound stream; the end marker fills its data."""
    outbound: dict[tuple[str, str], Any] = field(default_factory=dict)
    ended: set[tuple[str, str]] | None = None
    """Outbound streams whose sending stage returned (made on the first): a later chunk on one is refused."""
    links: set[OutboundLink] = field(default_factory=set)
    """Links this request sent frames on: if one breaks, the request cannot finish."""
    stream_sources: dict[tuple[str, str], list[Span[Any]]] | None = None
    """The stage Spans each inbound remote stream's opening carried open (the sending stage's, and those of
    stages streaming to it in its process); its end marker closes them (timings read)."""
    cancelled: bool = False
    failed: bool = False
    touched: float = field(default_factory=time.monotonic)
    """When a frame of this request last arrived (for expiring streams that went silent)."""
    remote_streams: set[tuple[str, str]] = field(default_factory=set)
    """Inbound streams opened by a frame from another process, whatever stage the frame names as src."""
    replicas: dict[str, str] | None = None
    """Replicated group address -> the replica this request's frames for that group go to."""
    origin: InboundLink | None = None
    """The inbound link whose frame opened this request here (None: opened locally); per-peer limits count it."""

    def stream_payload(self, src: str, dst: str) -> StagePayload | None:
        """The payload of the stage reading the stream from `src` to `dst`, if it was opened."""
        return self.stream_payloads.get((src, dst))


Refuse = Callable[[str, str], None]
"""Fail a request the table will not hold: (request id, why), as a Failure to the gateway."""


class Fail(Protocol):
    """Fail a held request at the gateway (StageRuntime.fail)."""

    def __call__(
        self,
        state: RequestState,
        stage: str,
        code: pb.FailureCode,
        message: str,
        client_message: str = "",
        error_type: str = "",
        client_code: str = "",
        client_field: str = "",
    ) -> None: ...


class RequestTable:
    """The requests one worker holds now, bounded in number and per peer, and the ids recently cancelled."""

    def __init__(
        self,
        peer_name: str,
        served: Container[str],
        release: Callable[[RequestState], None],
        refuse: Refuse,
        fail: Fail,
        *,
        max_requests: int = MAX_REQUESTS,
        stream_idle_timeout: float = STREAM_IDLE_TIMEOUT,
        keep_alive: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.peer_name = peer_name
        self._keep_alive = keep_alive
        """Told, every KEEP_ALIVE_INTERVAL at most, the requests this worker holds and still works on."""
        self._served = served
        self._release = release
        """Give back the replicas a request was routed to (addressing.Addresses.release)."""
        self._refuse = refuse
        self._fail = fail
        self.max_requests = max_requests
        self.stream_idle_timeout = stream_idle_timeout
        self.requests: dict[str, RequestState] = {}
        self._recent_cancels: OrderedDict[str, None] = OrderedDict()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._janitor: asyncio.Task[None] | None = None
        self._closed = ""
        """Why this table takes no new request (`close_to_new`), or "" while it does."""

    def __len__(self) -> int:
        return len(self.requests)

    def get(self, request_id: str) -> RequestState | None:
        return self.requests.get(request_id)

    def recently_cancelled(self, request_id: str) -> bool:
        return request_id in self._recent_cancels

    def admit(self, request_id: str, origin: InboundLink | None = None) -> RequestState | None:
        """The request's state, created on its first frame; None for a cancelled one, or when full.

        A request opened by a frame of inbound link `origin` counts against that link's share of the
        table (limits.per_peer_cap): one peer cannot take the places the others need.
        """
        if request_id in self._recent_cancels:
            return None
        state = self.requests.get(request_id)
        if state is None:
            if self._closed:
                self._refuse(request_id, self._closed)
                return None
            if len(self.requests) >= self.max_requests:
                self._refuse(
                    request_id,
                    f"worker {self.peer_name!r} already holds {self.max_requests} requests; "
                    "lower the admission limit or add replicas",
                )
                return None
            cap = per_peer_cap(self.max_requests)
            # Counting is needed only once the table holds more than one peer's share.
            if origin is not None and len(self.requests) >= cap and self._held_by(origin) >= cap:
                self._refuse(
                    request_id,
                    f"the peer {origin.peer or 'on this link'} already holds {cap} of worker "
                    f"{self.peer_name!r}'s {self.max_requests} request places (one peer's share); retry later",
                )
                return None
            state = self.requests[request_id] = RequestState(request_id, origin=origin)
            self._watch_idle()
        return state

    def _held_by(self, origin: InboundLink) -> int:
        return sum(1 for state in self.requests.values() if state.origin is origin)

    def task_done(self, state: RequestState, task: asyncio.Task[None], inbound: ChunkQueue | None) -> None:
        """A stage's task of this request ended: abandon the stream it read; forget the request once idle."""
        state.tasks.discard(task)
        if inbound is not None and not inbound.ended:
            inbound.abandon()
        self.forget_if_idle(state)

    def forget_if_idle(self, state: RequestState) -> None:
        if not state.tasks and self.requests.get(state.request_id) is state:
            del self.requests[state.request_id]
            if state.replicas:
                self._release(state)
            self._finished[state.request_id] = None
            if len(self._finished) > RECENT_FINISHED:
                self._finished.popitem(last=False)

    def finished(self) -> list[str]:
        """The requests whose work in this worker ended (the last RECENT_FINISHED), oldest first, that it does not
        hold again now: as it stops, the gateway must not fail those still going on elsewhere for its leaving."""
        return [request_id for request_id in self._finished if request_id not in self.requests]

    # ---- cancellation and shutdown ----------------------------------------------

    def remember_cancelled(self, request_id: str) -> None:
        self._recent_cancels[request_id] = None
        while len(self._recent_cancels) > RECENT_CANCELS:
            self._recent_cancels.popitem(last=False)

    def cancel(self, request_id: str, current: asyncio.Task[Any] | None = None) -> None:
        """Stop all work of a request in this worker and drop its buffered chunks."""
        self.remember_cancelled(request_id)
        state = self.requests.pop(request_id, None)
        if state is None:
            return
        if state.replicas:
            self._release(state)
        state.cancelled = True
        for queue in state.inbound.values():
            queue.drop()
        for out in state.outbound.values():
            if isinstance(out, CreditWindow):
                out.close()
            else:
                out.drop()
        for task in state.tasks:
            if task is not current:
                task.cancel()

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` seconds for the requests held here to end.

        Requests whose first frame arrives during the drain are waited for too
        (a sender may have routed one to this replica just before it left the rotation).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.requests and loop.time() < deadline:
            tasks = {t for s in self.requests.values() for t in s.tasks}
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=deadline - loop.time())

    def close_to_new(self, why: str) -> None:
        """From now on a frame that would open a request is refused, as a Failure to the gateway saying `why`:
        this worker is stopping, and a request it took now would end with it, unanswered."""
        self._closed = why

    async def fail_all(self, code: pb.FailureCode, message: str) -> None:
        """Fail every request held here at the gateway, then wait (up to a second) for their tasks to end."""
        tasks = {t for s in self.requests.values() for t in s.tasks}
        for state in self.states():
            self._fail(state, "", code, message)
            self.cancel(state.request_id)  # held though already failed or cancelled: it goes all the same
        leftover = {t for t in tasks if not t.done()}
        if leftover:
            await asyncio.wait(leftover, timeout=1.0)

    def states(self) -> Iterable[RequestState]:
        """A snapshot of the states held now (safe to fail them while iterating)."""
        return list(self.requests.values())

    # ---- expiry -------------------------------------------------------------------

    def _watch_idle(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._expire_idle(), name="expire-idle-streams")

    async def _expire_idle(self) -> None:
        interval = min(max(self.stream_idle_timeout / 4, 0.05), KEEP_ALIVE_INTERVAL)
        while self.requests:
            await asyncio.sleep(interval)
            self.expire_idle(time.monotonic())
            if self._keep_alive is not None:
                held = [request_id for request_id, state in self.requests.items() if self._works_on(state)]
                if held:
                    self._keep_alive(held)

    def _works_on(self, state: RequestState) -> bool:
        """Whether this worker works on `state`'s request itself: not ended here, and not waiting on a stream from
        another worker (that worker, while it holds the request, says so itself; one that died cannot, and the
        gateway's idle timeout then fails the request)."""
        return not (state.failed or state.cancelled or self._peer_streams_waited_on(state))

    def _peer_streams_waited_on(self, state: RequestState) -> list[tuple[str, str]]:
        """The (src, dst) streams from other workers that `state`'s stages wait on: open, nothing queued."""
        waiting = [key for key, queue in state.inbound.items() if not queue.ended and not len(queue)]
        # A frame that came over a link feeds the stream, even one naming a local stage as its sender.
        return [key for key in waiting if key in state.remote_streams or key[0] not in self._served]

    def expire_idle(self, now: float) -> int:
        """Fail requests whose stage waits on a stream silent for stream_idle_timeout; return how many."""
        expired = 0
        for state in list(self.requests.values()):
            remote = self._peer_streams_waited_on(state)
            if remote and now - state.touched > self.stream_idle_timeout:
                src, dst = remote[0]
                self._fail(
                    state,
                    dst,
                    pb.FAILURE_CODE_UNAVAILABLE,
                    f"stage {dst!r} received nothing from stage {src!r} for "
                    f"{self.stream_idle_timeout:g} s; its sender is gone",
                )
                expired += 1
        return expired

    def close(self) -> None:
        """Stop the expiry task."""
        if self._janitor is not None:
            self._janitor.cancel()
