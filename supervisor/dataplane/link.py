"""Links: one long-lived bidirectional gRPC stream per linked pair, multiplexing every request.

The sender dials (`OutboundLink`, lazily, on its first frame) and writes
frames; the listener (`serve_links`) dispatches them and answers on the same
stream with credit frames. Frames queued while a write is in flight go out
together as one gRPC message: each frame is serialized once when it is sent
and a batch is the concatenation of their wire encodings, so batching costs no
re-encoding. A link that breaks is dropped from its pool; the next frame to
that address dials again, so a restarted peer on the same address is found.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import grpc

from stagevisor.supervisor._proto import dataplane_pb2 as pb

log = logging.getLogger(__name__)

LINK_METHOD = "/stagevisor.v1.DataPlane/Link"
MAX_BATCH_BYTES = 4 * 1024 * 1024
"""A batch is flushed once it reaches this size, well under the message limit below."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
HIGH_WATER_BYTES = 16 * 1024 * 1024
"""Senders awaiting `send_async` wait while more than this is queued on one link."""
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Each link gets its own subchannel: gRPC otherwise shares subchannels per
# address process-wide, and one that failed while a peer restarted stays in
# reconnect backoff, refusing the fresh link to the restarted peer.
CHANNEL_OPTIONS = GRPC_OPTIONS + [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def frame_bytes(frame: pb.Frame) -> bytes:
    """The frame as one element of FrameBatch.frames on the wire (field 1, length-delimited)."""
    body = frame.SerializeToString()
    return b"\x0a" + _varint(len(body)) + body


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _identity(data: bytes) -> bytes:
    return data


class _Batcher:
    """Queues serialized frames and writes them, batched, with one writer task."""

    def __init__(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        self._write = write
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._writing = False
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    def push(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > HIGH_WATER_BYTES:
            self._drained.clear()
        self._wake.set()

    async def wait_drained(self) -> None:
        await self._drained.wait()

    @property
    def idle(self) -> bool:
        """Nothing queued and no write in progress."""
        return not self._pending and not self._writing

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
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


class OutboundLink:
    """The dialling side of one link; frames written here reach the peer in order."""

    def __init__(
        self,
        address: str,
        peer_name: str,
        on_frame: Callable[[pb.Frame], None],
        on_broken: Callable[["OutboundLink", BaseException], None],
    ) -> None:
        self.address = address
        self.broken = False
        self._closing = False
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._call = self._channel.stream_stream(
            LINK_METHOD, request_serializer=_identity, response_deserializer=pb.FrameBatch.FromString
        )()
        self._batcher = _Batcher(self._call.write)
        self._batcher.start()
        self._batcher.task.add_done_callback(self._task_ended)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self._reader.add_done_callback(self._task_ended)
        self.send(pb.Frame(hello=pb.Hello(peer=peer_name)))

    def send(self, frame: pb.Frame) -> None:
        """Queue a frame; it is written with whatever else is pending."""
        self._batcher.push(frame_bytes(frame))

    async def send_async(self, frame: pb.Frame) -> None:
        """Queue a frame, then wait while the link is over its high-water mark (backpressure)."""
        self._batcher.push(frame_bytes(frame))
        await self._batcher.wait_drained()

    async def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every queued frame was written; False if not."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._batcher.idle and not self.broken:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.002)
        return self._batcher.idle

    async def _read(self) -> None:
        while True:
            batch = await self._call.read()
            if batch is grpc.aio.EOF:
                raise ConnectionError(f"peer at {self.address} closed the link")
            for frame in batch.frames:
                self._on_frame(frame)

    def _task_ended(self, task: asyncio.Task) -> None:
        if self.broken:
            return
        error = task.exception() if not task.cancelled() else asyncio.CancelledError()
        self.broken = True
        self._cancel_tasks()
        if isinstance(error, asyncio.CancelledError) and self._closing:
            return
        log.info("data-plane link to %s broke: %s", self.address, _describe(error))
        self._on_broken(self, error or ConnectionError("link ended"))

    def _cancel_tasks(self) -> None:
        for task in (self._batcher.task, self._reader):
            if task is not None and not task.done():
                task.cancel()
        self._call.cancel()

    async def close(self) -> None:
        self._closing = True
        self.broken = True
        self._cancel_tasks()
        await self._channel.close(grace=None)


class LinkPool:
    """Outbound links of one node, by peer address; created on first use, replaced when broken."""

    def __init__(
        self,
        peer_name: str,
        on_frame: Callable[[pb.Frame], None],
        on_broken: Callable[[OutboundLink, BaseException], None],
    ) -> None:
        self.peer_name = peer_name
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._links: dict[str, OutboundLink] = {}

    def get(self, address: str) -> OutboundLink:
        link = self._links.get(address)
        if link is None or link.broken:
            link = OutboundLink(address, self.peer_name, self._on_frame, self._broken)
            self._links[address] = link
        return link

    def send(self, address: str, frame: pb.Frame) -> None:
        self.get(address).send(frame)

    def _broken(self, link: OutboundLink, error: BaseException) -> None:
        if self._links.get(link.address) is link:
            del self._links[link.address]
        self._on_broken(link, error)

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)


class InboundLink:
    """The listening side of one link: frames arrive through the node; `reply` sends credits back."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.peer = ""
        self._loop = asyncio.get_running_loop()
        self._batcher = _Batcher(context.write)
        self._batcher.start()

    def reply(self, frame: pb.Frame) -> None:
        self._batcher.push(frame_bytes(frame))

    def release(self, name: str) -> None:
        """Tell the sender a pooled shared buffer is free again; callable from any thread."""
        try:
            self._loop.call_soon_threadsafe(self.reply, pb.Frame(release=pb.Release(names=[name])))
        except RuntimeError:
            pass  # the loop is gone: the worker is exiting and the sender's pool goes with the daemon

    def close(self) -> None:
        if self._batcher.task is not None:
            self._batcher.task.cancel()


def serve_links(
    server: grpc.aio.Server,
    on_frame: Callable[[pb.Frame, InboundLink], None],
    on_closed: Callable[[InboundLink], None] = lambda link: None,
) -> None:
    """Register the DataPlane service on `server`, dispatching every inbound frame to `on_frame`."""

    async def link(request_iterator, context: grpc.aio.ServicerContext) -> None:
        inbound = InboundLink(context)
        try:
            async for batch in request_iterator:
                for frame in batch.frames:
                    if frame.WhichOneof("body") == "hello":
                        inbound.peer = frame.hello.peer
                    else:
                        on_frame(frame, inbound)
        except asyncio.CancelledError:
            pass  # the server is stopping; the peer sees the link break and re-dials later
        finally:
            inbound.close()
            on_closed(inbound)

    handler = grpc.stream_stream_rpc_method_handler(
        link, request_deserializer=pb.FrameBatch.FromString, response_serializer=_identity
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("stagevisor.v1.DataPlane", {"Link": handler}),)
    )


async def stop_server(server: grpc.aio.Server, settle: float = 1.0) -> None:
    """Stop a data-plane server and let the RPC tasks it cancelled finish.

    grpc.aio wraps each RPC in a task that outlives `server.stop()` by a few
    loop iterations; if `asyncio.run` exits first it cancels that task and grpc
    logs the cancellation as an unhandled error on every clean shutdown.
    """
    await server.stop(0)
    leftovers = [t for t in asyncio.all_tasks()
                 if getattr(t.get_coro(), "__name__", "") == "_schedule_rpc_coro"]
    if leftovers:
        await asyncio.wait(leftovers, timeout=settle)


def _describe(error: BaseException | None) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return repr(error)
