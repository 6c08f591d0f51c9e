"""Per-request stream state: the bounded chunk queue a stage reads, and the sender's credit window."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncIterator, Callable, Protocol

STREAM_WINDOW = 8
"""Chunks a stream may have buffered at its receiver; the producer's ctx.stream waits beyond it."""


class ChunkCount(Protocol):
    """Where an edge's chunks are counted (metrics/recorder.py's EdgeStats)."""

    chunks: int


class ChunkQueue:
    """Chunks of one stream (one request, one src -> dst edge) waiting for the receiving stage.

    In-process producers `put` and wait while the queue is full. Remote
    producers `push` without waiting: their sender already waits for credits,
    and `on_consumed` returns one credit per chunk the stage takes.
    """

    def __init__(self, capacity: int = STREAM_WINDOW, on_consumed: Callable[[], None] | None = None) -> None:
        self.capacity = capacity
        self._items: deque[Any] = deque()
        self._ended = False
        self._dropped = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._on_consumed = on_consumed
        self.edge: ChunkCount | None = None
        """The EdgeStats (metrics/recorder.py) whose `chunks` an in-process producer's chunks count in; None: not
        counted (metrics off, or a remote stream: its chunks are counted as they arrive)."""

    @property
    def ended(self) -> bool:
        return self._ended

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: Any) -> None:
        while len(self._items) >= self.capacity and not self._dropped:
            self._writable.clear()
            await self._writable.wait()
        if not self._dropped:
            self.push(item)

    def push(self, item: Any) -> None:
        if self._dropped:
            if self._on_consumed is not None:
                self._on_consumed()
            return
        self._items.append(item)
        self._readable.set()

    def end(self) -> None:
        self._ended = True
        self._readable.set()

    def drop(self) -> None:
        """Forget buffered chunks and release waiting producers (the request was cancelled)."""
        self._dropped = True
        self._ended = True
        self._items.clear()
        self._readable.set()
        self._writable.set()

    def abandon(self) -> None:
        """The stage returned without reading everything: discard what is left, keep credits flowing."""
        pending = len(self._items)
        self._dropped = True
        self._items.clear()
        self._writable.set()
        if self._on_consumed is not None:
            for _ in range(pending):
                self._on_consumed()

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            if self._items:
                item = self._items.popleft()
                self._writable.set()
                if self._on_consumed is not None:
                    self._on_consumed()
                yield item
                continue
            if self._ended:
                return
            self._readable.clear()
            await self._readable.wait()


class CreditWindow:
    """The sender's side of a remote stream: how many more chunks the receiver will buffer."""

    def __init__(self, credits: int = STREAM_WINDOW) -> None:
        self.credits = credits
        self.opened = False
        self._available = asyncio.Event()
        self._available.set()
        self._closed = False

    async def acquire(self) -> None:
        while self.credits <= 0 and not self._closed:
            self._available.clear()
            await self._available.wait()
        self.credits -= 1

    def release(self, count: int) -> None:
        self.credits += count
        self._available.set()

    def close(self) -> None:
        """No more chunks on this stream (it ended, or its request did): a sender waiting for credit goes on."""
        self._closed = True
        self._available.set()

    @property
    def closed(self) -> bool:
        return self._closed


async def empty_chunks() -> AsyncIterator[Any]:
    """The chunks of a stage that is not a stream_to target: none."""
    return
    yield  # pragma: no cover - makes this an async generator
