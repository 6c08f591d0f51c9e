"""A tiny in-process chain runner implementing the StageContext protocol, for executor unit tests.

It runs a linear chain of stages in one event loop the way the worker runtime
does: a plain edge hands the returned dict to the next stage; a streaming edge
starts the downstream stage when the stream opens, feeds it the upstream's
chunks through a small bounded queue (awaiting `stream` is the backpressure),
then fills its `payload.data` with the upstream's final data before the end
marker. The last stage's chunks are collected as the client's output.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Sequence

import numpy as np

from stagevisor.stages.base import StagePayload

_END = object()
END = _END
"""Put on a DriverContext's inbox after the last chunk: ends its `chunks()`."""
_ids = itertools.count()


class DriverContext:
    """StageContext for one stage and one request."""

    def __init__(self, request_id: str, inbox: asyncio.Queue | None, outbox: asyncio.Queue | None, sink: list) -> None:
        self._request_id = request_id
        self._inbox = inbox
        self._outbox = outbox
        self._sink = sink
        self.cancel_after_chunks: int | None = None
        self.cancelled_flag = False
        self.streamed = 0

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def cancelled(self) -> bool:
        return self.cancelled_flag

    async def stream(self, chunk: Any) -> None:
        self.streamed += 1
        if self._outbox is not None:
            await self._outbox.put(chunk)
        else:
            self._sink.append(chunk)
        if self.cancel_after_chunks is not None and self.streamed >= self.cancel_after_chunks:
            self.cancelled_flag = True

    async def chunks(self) -> AsyncIterator[Any]:
        if self._inbox is None:
            return
        while True:
            item = await self._inbox.get()
            if item is _END:
                return
            yield item


@dataclass
class ChainResult:
    """What a chain run produced: the client's chunks and each stage's returned data."""

    chunks: list[Any]
    finals: list[dict[str, Any]]
    contexts: list[DriverContext] = field(default_factory=list)

    def audio(self) -> np.ndarray:
        parts = [c["audio"] for c in self.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    @property
    def sample_rate(self) -> int:
        return int(self.chunks[0]["sample_rate"])


async def run_chain_async(
    stages: Sequence[Any], request: dict[str, Any], stream_edges: set[int] | None = None, request_id: str | None = None
) -> ChainResult:
    """Run `stages` in order for one request. `stream_edges` holds i for each streaming edge i -> i+1.

    By default the edge into the last stage streams (engine ~> vocoder). Stages joined by streaming edges run
    at once; what a stage streams with no streaming edge out is dropped unless it is the last (as the runtime
    does).
    """
    n = len(stages)
    stream_edges = {n - 2} if stream_edges is None else stream_edges
    rid = request_id or f"req-{next(_ids)}"
    sink: list[Any] = []
    finals: list[dict[str, Any]] = []
    contexts: list[DriverContext] = []
    queues = {i: asyncio.Queue(maxsize=2) for i in stream_edges if i + 1 < n}
    data: dict[str, Any] = {}
    i = 0
    while i < n:
        last = i
        while last in queues:
            last += 1
        group = range(i, last + 1)
        payloads = {k: StagePayload(rid, request, dict(data) if k == i else {}) for k in group}
        ctxs = {k: DriverContext(rid, queues.get(k - 1), queues.get(k), sink if k == n - 1 else []) for k in group}

        tasks = [
            asyncio.ensure_future(_run_stage(stages[k], payloads[k], ctxs[k], queues.get(k), payloads.get(k + 1)))
            for k in group
        ]
        try:
            done = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        finals += done
        contexts += [ctxs[k] for k in group]
        data = done[-1]
        i = last + 1
    return ChainResult(sink, finals, contexts)


async def _run_stage(
    stage: Any, payload: StagePayload, ctx: DriverContext, out: asyncio.Queue | None, down: StagePayload | None
) -> dict[str, Any]:
    """One stage of a chain; on a streaming edge out, the downstream's data is filled before the end marker."""
    final = await stage.process(payload, ctx) or {}
    if out is not None and down is not None:
        down.data.update(final)
        await out.put(_END)
    return final


def run_chain(stages: Sequence[Any], request: dict[str, Any], **kwargs: Any) -> ChainResult:
    """Synchronous wrapper around run_chain_async."""
    return asyncio.run(run_chain_async(stages, request, **kwargs))


def request(text: str, **options: Any) -> dict[str, Any]:
    """A client request dict as it reaches the first stage."""
    return {
        "text": text,
        "voice": "",
        "reference_audio": b"",
        "reference_transcript": "",
        "options": {k: str(v) for k, v in options.items()},
    }


PIPER_NOISELESS = {"noise_scale": 0, "noise_w": 0}
