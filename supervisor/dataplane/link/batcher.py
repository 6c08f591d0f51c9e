"""Batcher: the one writer of a link's side, sending every frame queued while a write was in flight as one message.

Senders push serialized frames; a single task writes them, all that is
queued (up to MAX_BATCH_BYTES) as one gRPC message. Past HIGH_WATER_BYTES
queued, senders that await `wait_drained` wait (backpressure).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

MAX_BATCH_BYTES = 4 * 1024 * 1024
"""A batch is flushed once it reaches this size, well under the message limit (outbound.MAX_MESSAGE_BYTES)."""
HIGH_WATER_BYTES = 16 * 1024 * 1024
"""Senders awaiting `send_async` wait while more than this is queued on one link."""


class Batcher:
    """Queues serialized frames and writes them, batched, with one writer task."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]], gather: Callable[[], None] | None = None) -> None:
        self._write = write
        self._gather = gather
        """Called before each batch is cut: a last chance to push (InboundLink adds its merged credits)."""
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._writing = False
        self._stopping = False
        """Set by `stop`: the writer ends once the write under way does."""
        self.task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        task = self.task = asyncio.get_running_loop().create_task(self._run())
        return task

    def push(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > HIGH_WATER_BYTES:
            self._drained.clear()
        self._wake.set()

    def wake(self) -> None:
        """Have the writer call `gather` soon, with nothing pushed yet."""
        self._wake.set()

    async def wait_drained(self) -> None:
        await self._drained.wait()

    @property
    def drained(self) -> bool:
        """Under the high-water mark: a sender need not wait."""
        return self._drained.is_set()

    @property
    def idle(self) -> bool:
        """Nothing queued and no write in progress."""
        return not self._pending and not self._writing

    def detach(self) -> None:
        """Let go of the writer and the task (after the task ended): a write from now on fails.

        What the writer references (a gRPC call, its channel) is freed with it.
        """
        self._write = closed_write
        self.task = None

    def discard(self) -> None:
        """Write nothing more: what is queued is dropped, and the writer ends once the write under way does."""
        self._pending.clear()
        self._pending_bytes = 0
        self._stopping = True
        self._wake.set()

    async def stop(self, timeout: float) -> None:
        """`discard`, then wait for the writer to end: a write under way finishes first (up to `timeout` seconds,
        then it is cancelled), for a gRPC call must not end with one of its writes cancelled half-way."""
        self.discard()
        task = self.task
        if task is None:
            return
        await asyncio.wait({task}, timeout=timeout)
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # a write to a peer that is gone fails: that is its end

    async def _run(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._gather is not None:
                self._gather()
            while self._pending and not self._stopping:
                if self._pending_bytes <= MAX_BATCH_BYTES:  # the usual case: everything queued goes
                    parts, self._pending = self._pending, []
                    size = self._pending_bytes
                else:
                    count, size = 0, 0
                    for data in self._pending:
                        if count and size + len(data) > MAX_BATCH_BYTES:
                            break
                        count += 1
                        size += len(data)
                    parts = self._pending[:count]
                    del self._pending[:count]
                self._pending_bytes -= size
                self._writing = True
                try:
                    await self._write(b"".join(parts))
                finally:
                    self._writing = False
                if self._pending_bytes <= HIGH_WATER_BYTES:
                    self._drained.set()


async def closed_write(data: bytes) -> None:
    raise ConnectionError("the link is closed")
