"""Invocation: the StageContext one stage gets while it works on one request (stages/base.py).

The runtime reuses an invocation for the next stage of a chain of direct
calls, which is why a context is valid only inside process(). Chunks a stage
streams go to the invocation's Streams (emit.Emitter).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Protocol

from stagevisor.stages.base import StagePayload
from stagevisor.supervisor.dataplane.request_state import RequestState
from stagevisor.supervisor.dataplane.streams import ChunkQueue, empty_chunks
from stagevisor.supervisor.dataplane.trace import Trace


class Streams(Protocol):
    """Where the chunks an invocation streams go."""

    async def stream_chunk(self, inv: "Invocation", chunk: Any) -> None:
        """Hand one chunk to every `stream_to` stage of the invocation's stage (the client for a terminal one)."""


class Invocation:
    """The StageContext of one stage working on one request."""

    __slots__ = ("_streams", "state", "stage", "payload", "_base", "run", "inbound")

    def __init__(
        self,
        streams: Streams,
        state: RequestState,
        stage: str,
        payload: StagePayload,
        trace: Trace,
        inbound: ChunkQueue | None = None,
    ) -> None:
        self._streams = streams
        self.state = state
        """The runtime's bookkeeping of the request (not for stages)."""
        self.stage = stage
        self.payload = payload
        self._base = trace
        self.run: tuple[str, ...] | None = None
        """The direct hops taken since `_base` (a prebuilt trace.Run), set by StageCalls at each direct call."""
        self.inbound = inbound

    @property
    def trace(self) -> Trace:
        """The request's trace up to this stage: `_base`, then the direct hops' Run, if any (see StageCalls.run)."""
        run = self.run
        return self._base if run is None else (self._base, run)

    @trace.setter
    def trace(self, trace: Trace) -> None:
        self._base, self.run = trace, None

    @property
    def request_id(self) -> str:
        return self.state.request_id

    @property
    def cancelled(self) -> bool:
        return self.state.cancelled or self.state.failed

    async def stream(self, chunk: Any) -> None:
        await self._streams.stream_chunk(self, chunk)

    def chunks(self) -> AsyncIterator[Any]:
        return self.inbound.__aiter__() if self.inbound is not None else empty_chunks()


def cancelled_from_outside() -> bool:
    """Whether the running task was asked to stop (a CANCEL frame, shutdown), as opposed to code in it
    raising CancelledError of its own; where Python (3.10) cannot tell, assume it was asked."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0
