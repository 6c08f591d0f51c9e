"""Links: one long-lived bidirectional gRPC stream per linked pair, multiplexing every request.

The sender dials (`OutboundLink`, lazily, on its first frame) and writes
frames; the listener (`serve_links`) dispatches them and answers on the same
stream with credit frames. Frames queued while a write is in flight go out
together as one gRPC message: each frame is serialized once when it is sent
and a batch is the concatenation of their wire encodings, so batching costs no
re-encoding. A link that breaks is dropped from its pool; the next frame to
that address dials again, so a restarted peer on the same address is found.

A link never dies of what a peer wrote: each frame of a batch is parsed on
its own, and one that does not parse is reported (with its request id, when
that much can be read) so only its request fails. Pooled shared buffers are
held by the link their frame went out on until the peer releases them; when
the link breaks, the buffers it still holds are dropped, never leaked.
Credits a listener returns for one stream within a batch travel as one frame.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, NamedTuple, Protocol, Sequence

import grpc
from google.protobuf.message import DecodeError

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import CodecError, OutOfLine, piece_frames
from stagevisor.supervisor.dataplane.peers import Dial, PeerDirectory
from stagevisor.supervisor.logs import Throttled

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
    body: bytes = frame.SerializeToString()
    size = len(body)
    if size < 0x80:
        return bytes((0x0A, size)) + body
    if size < 0x4000:
        return bytes((0x0A, size & 0x7F | 0x80, size >> 7)) + body
    return b"\x0a" + _varint(size) + body


bad_frames_log = Throttled(log)
"""Warnings about what peers sent (bad frames, refused buffers): one budget per process."""


class BadFrame(NamedTuple):
    """A frame that did not parse: its request id where it could be read, and why."""

    request_id: str
    error: str


def parse_batch(data: bytes) -> tuple[list[pb.Frame], list[BadFrame]]:
    """The frames of a serialized FrameBatch; frames that do not parse are returned apart."""
    try:
        return list(pb.FrameBatch.FromString(data).frames), []
    except DecodeError:
        pass
    frames: list[pb.Frame] = []
    bad: list[BadFrame] = []
    position = 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        if tag != 0x0A or position < 0:
            bad.append(BadFrame("", "a frame batch with a malformed envelope; the rest of it was dropped"))
            break
        length, position = _read_varint(data, position)
        if position < 0 or position + length > len(data):
            bad.append(BadFrame("", "a frame batch cut short; the rest of it was dropped"))
            break
        body = data[position : position + length]
        position += length
        try:
            frames.append(pb.Frame.FromString(body))
        except DecodeError as error:
            bad.append(BadFrame(_request_id_of(body), f"a malformed frame ({error})"))
    return frames, bad


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, next position); next position -1 when the varint is cut short or too long."""
    value = shift = 0
    while position < len(data) and shift < 64:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    return 0, -1


def _request_id_of(body: bytes) -> str:
    """Field 1 (request_id) of a Frame that does not parse as a whole, if it is readable and leads."""
    if body[:1] != b"\x0a":
        return ""
    length, position = _read_varint(body, 1)
    if position < 0 or length > 256 or position + length > len(body):
        return ""
    try:
        return body[position : position + length].decode()
    except UnicodeDecodeError:
        return ""


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
        self._write = _closed_write
        self.task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._gather is not None:
                self._gather()
            while self._pending:
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


class Buffers(Protocol):
    """What a link tells its node's codec about pooled shared buffers it carried."""

    def release(self, names: Iterable[str]) -> None:
        """The peer is done with these: they may be reused."""

    def drop(self, names: Iterable[str]) -> None:
        """The peer can no longer release these: remove them."""


class OutboundLink:
    """The dialling side of one link; frames written here reach the peer in order."""

    def __init__(
        self,
        address: str,
        peer_name: str,
        on_frame: Callable[[pb.Frame], None],
        on_broken: Callable[["OutboundLink", BaseException], None],
        buffers: Buffers | None = None,
        dial: Dial | None = None,
    ) -> None:
        self.address = address
        """The peer's address in `routes` (what names it); `dial` (peers.Dial) says where it is dialled."""
        self.remote = bool(dial is not None and dial.remote)
        """True when the peer runs on another node (a TCP link: no shared memory on it)."""
        self.broken = False
        self._closing = False
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._buffers = buffers
        self.holds: set[str] = set()
        """Pooled shared buffers (the tokens of their writes) sent on this link and not yet released by the peer."""
        if dial is not None and dial.credentials is not None:
            self._channel = grpc.aio.secure_channel(
                dial.target, dial.credentials, options=CHANNEL_OPTIONS + dial.options
            )
        else:
            self._channel = grpc.aio.insecure_channel(
                dial.target if dial is not None else address, options=CHANNEL_OPTIONS
            )
        self._call = self._channel.stream_stream(
            LINK_METHOD, request_serializer=_identity, response_deserializer=_identity
        )(metadata=dial.metadata if dial is not None and dial.metadata else None)
        self._batcher = _Batcher(self._call.write)
        self._batcher.start().add_done_callback(self._task_ended)
        reader = asyncio.get_running_loop().create_task(self._read())
        reader.add_done_callback(self._task_ended)
        self._reader: asyncio.Task[None] | None = reader
        self.send(pb.Frame(hello=pb.Hello(peer=peer_name)))

    def send(self, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        """Queue a frame (after the pieces of its inline buffers); it is written with whatever else is pending."""
        if out:
            self._hold(out.segments)
            for piece in piece_frames(frame.request_id, out.pieces):
                self._batcher.push(frame_bytes(piece))
        self._batcher.push(frame_bytes(frame))

    async def send_async(self, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        """Queue a frame, waiting while the link is over its high-water mark (backpressure)."""
        batcher = self._batcher
        if out is not None and (out.segments or out.pieces):
            self._hold(out.segments)
            for piece in piece_frames(frame.request_id, out.pieces):
                batcher.push(frame_bytes(piece))
                await batcher.wait_drained()
        batcher.push(frame_bytes(frame))
        if not batcher.drained:  # no coroutine per frame while under the high-water mark
            await batcher.wait_drained()

    async def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every queued frame was written; False if not."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self._batcher.idle and not self.broken:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.002)
        return self._batcher.idle

    def _hold(self, names: Sequence[str]) -> None:
        if not names:
            return
        if self.broken:
            if self._buffers is not None:
                self._buffers.drop(names)  # nobody will ever release them
            return
        self.holds.update(names)

    async def _read(self) -> None:
        while True:
            data = await self._call.read()
            if data is grpc.aio.EOF:
                raise ConnectionError(f"peer at {self.address} closed the link")
            frames, bad = parse_batch(data)
            for item in bad:
                bad_frames_log.warning("ignoring %s from %s", item.error, self.address)
            for frame in frames:
                if frame.WhichOneof("body") == "release":
                    self._released(frame.release.names)
                else:
                    self._on_frame(frame)

    def _released(self, names: Iterable[str]) -> None:
        # Only what was sent on this link: a peer cannot free another link's buffers.
        mine = [name for name in names if name in self.holds]
        self.holds.difference_update(mine)
        if mine and self._buffers is not None:
            self._buffers.release(mine)

    def _drop_holds(self) -> None:
        held, self.holds = self.holds, set()
        if held and self._buffers is not None:
            self._buffers.drop(held)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        error = task.exception() if not task.cancelled() else asyncio.CancelledError()  # always retrieved
        if self.broken:
            return
        self.broken = True
        self._cancel_tasks()
        self._drop_holds()
        _background(self._close_channel())  # its socket and fds, now, not at exit
        if isinstance(error, asyncio.CancelledError) and self._closing:
            return
        if out_of_descriptors(error):
            log.warning(
                "data-plane link to %s broke: this process is out of file descriptors (%s); raise its limit "
                "(ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=)",
                self.address,
                _describe(error),
            )
        else:
            log.info("data-plane link to %s broke: %s", self.address, _describe(error))
        self._on_broken(self, error or ConnectionError("link ended"))

    async def _close_channel(self) -> None:
        await asyncio.gather(*(t for t in (self._batcher.task, self._reader) if t is not None), return_exceptions=True)
        await self._channel.close(grace=None)
        # Let go of the call and channel objects: while a cancelled call object lives,
        # gRPC core keeps its closed channel's subchannel reconnecting, and once the
        # peer is back that holds a connection (a socket per broken link) for good.
        # The finished tasks too: their exceptions' tracebacks reference the call.
        self._batcher.detach()
        self._reader = None
        self._call = None
        self._channel = None

    def _cancel_tasks(self) -> None:
        for task in (self._batcher.task, self._reader):
            if task is not None and not task.done():
                task.cancel()
        if self._call is not None:
            self._call.cancel()

    async def close(self) -> None:
        already = self.broken
        self._closing = True
        self.broken = True
        self._cancel_tasks()
        self._drop_holds()
        if not already and self._channel is not None:
            await self._close_channel()


async def _closed_write(data: bytes) -> None:
    raise ConnectionError("the link is closed")


_background_tasks: set[asyncio.Future[None]] = set()


def _background(coro: Awaitable[None]) -> None:
    task = asyncio.ensure_future(coro)
    _background_tasks.add(task)
    task.add_done_callback(_background_tasks.discard)


class LinkPool:
    """Outbound links of one node, by peer address; created on first use, replaced when broken."""

    def __init__(
        self,
        peer_name: str,
        on_frame: Callable[[pb.Frame], None],
        on_broken: Callable[[OutboundLink, BaseException], None],
        buffers: Buffers | None = None,
        directory: PeerDirectory | None = None,
    ) -> None:
        self.peer_name = peer_name
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._buffers = buffers
        self.directory = directory
        """A peers.PeerDirectory under --launcher ray (peers on other nodes are dialled over TCP); else None."""
        self._links: dict[str, OutboundLink] = {}

    def get(self, address: str) -> OutboundLink:
        link = self._links.get(address)
        if link is None or link.broken:
            dial = self.directory.dial(address) if self.directory else None
            link = OutboundLink(address, self.peer_name, self._on_frame, self._broken, self._buffers, dial)
            self._links[address] = link
        return link

    def send(self, address: str, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        self.get(address).send(frame, out)

    def send_if_linked(self, address: str, frame: pb.Frame) -> bool:
        """Send on a live link only, never dialling: a peer whose link broke has nothing to be told."""
        link = self._links.get(address)
        if link is None or link.broken:
            return False
        link.send(frame)
        return True

    async def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) until what was queued on every live link is written."""
        live = [link for link in self._links.values() if not link.broken]
        await asyncio.gather(*(link.flush(timeout) for link in live), return_exceptions=True)

    def _broken(self, link: OutboundLink, error: BaseException) -> None:
        if self._links.get(link.address) is link:
            del self._links[link.address]
        self._on_broken(link, error)

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)


MAX_ASSEMBLING_BYTES = 512 * 1024 * 1024
"""Inline buffers one link may hold half-assembled or unclaimed; beyond it, pieces fail their request."""
MAX_ASSEMBLING_BUFFERS = 4096
PIECE_IDLE_SECONDS = 60.0
"""An inline buffer no piece or frame touched for this long is forgotten (its frame never came)."""


@dataclass
class _Assembly:
    request_id: str
    data: bytearray
    filled: int
    touched: float


class PieceAssembler:
    """Inline buffers arriving in Pieces on one link, bounded in bytes, count and time."""

    def __init__(
        self,
        max_bytes: int = MAX_ASSEMBLING_BYTES,
        max_buffers: int = MAX_ASSEMBLING_BUFFERS,
        idle: float = PIECE_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_buffers = max_buffers
        self.idle = idle
        self._clock = clock
        self._buffers: dict[str, _Assembly] = {}
        self.bytes = 0
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._buffers)

    def add(self, request_id: str, piece: pb.Piece) -> str | None:
        """Take one piece in; an error message (and the buffer forgotten) when it does not fit."""
        now = self._clock()
        self._expire(now)
        assembly = self._buffers.get(piece.buffer)
        if assembly is None:
            if piece.offset != 0:
                return f"a piece of inline buffer {piece.buffer[:40]!r} arrived without its start"
            if self.bytes + piece.total > self.max_bytes or len(self._buffers) >= self.max_buffers:
                return (
                    f"an inline buffer of {piece.total} bytes exceeds what a link may hold "
                    f"({self.max_bytes} bytes in {self.max_buffers} buffers)"
                )
            assembly = self._buffers[piece.buffer] = _Assembly(request_id, bytearray(piece.total), 0, now)
            self.bytes += piece.total
        end = piece.offset + len(piece.data)
        if (
            piece.offset != assembly.filled
            or end > len(assembly.data)
            or piece.total != len(assembly.data)
            or request_id != assembly.request_id
        ):
            self.discard(piece.buffer)
            return f"inline buffer {piece.buffer[:40]!r} arrived out of order or over its size"
        assembly.data[piece.offset : end] = piece.data
        assembly.filled = end
        assembly.touched = now
        return None

    def take(self, buffer_id: str, size: int) -> bytearray:
        assembly = self._buffers.pop(buffer_id, None)
        if assembly is None:
            raise CodecError(f"inline buffer {buffer_id[:40]!r} never arrived")
        self.bytes -= len(assembly.data)
        if assembly.filled != len(assembly.data) or len(assembly.data) != size:
            raise CodecError(f"inline buffer {buffer_id[:40]!r} is incomplete ({assembly.filled} of {size} bytes)")
        return assembly.data

    def discard(self, buffer_id: str) -> None:
        assembly = self._buffers.pop(buffer_id, None)
        if assembly is not None:
            self.bytes -= len(assembly.data)

    def clear(self) -> None:
        self._buffers.clear()
        self.bytes = 0

    def _expire(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for buffer_id in [b for b, a in self._buffers.items() if now - a.touched > self.idle]:
            self.discard(buffer_id)


class InboundLink:
    """The listening side of one link: frames arrive through the node; `reply` sends credits back.

    It is the BufferSource of the frames it carries: it assembles their
    inline buffers and sends Release frames for their pooled ones.
    """

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        self.peer = ""
        try:  # a TCP peer (another node, under --launcher ray) vs a unix socket on this one
            self.tcp = not str(context.peer() or "unix:").startswith("unix")
        except Exception:  # noqa: BLE001 - a description only
            self.tcp = False
        self.pieces = PieceAssembler()
        self._loop = asyncio.get_running_loop()
        self._credits: dict[tuple[str, str, str], int] = {}
        """Credits not yet written, per stream (request, src, dst): one Credit frame each per batch."""
        self._batcher = _Batcher(context.write, self._gather_credits)
        self._batcher.start()

    def reply(self, frame: pb.Frame) -> None:
        if frame.WhichOneof("body") == "credit":
            self.credit((frame.request_id, frame.src, frame.dst), frame.credit.chunks)
            return
        self._batcher.push(frame_bytes(frame))

    def credit(self, stream: tuple[str, str, str], chunks: int = 1) -> None:
        """Return `chunks` credits of a stream (request_id, src, dst) to its sender.

        Credits of one stream add up: the chunks of a batch go back as one frame, so
        neither side serializes, parses and dispatches a Credit frame per chunk.
        """
        credits = self._credits
        if not credits:
            self._batcher.wake()
        credits[stream] = credits.get(stream, 0) + chunks

    def _gather_credits(self) -> None:
        if not self._credits:
            return
        credits, self._credits = self._credits, {}
        push = self._batcher.push
        for (request_id, src, dst), chunks in credits.items():
            push(frame_bytes(pb.Frame(request_id=request_id, src=src, dst=dst, credit=pb.Credit(chunks=chunks))))

    def release(self, name: str) -> None:
        """Tell the sender a pooled shared buffer is free again; callable from any thread."""
        try:
            self._loop.call_soon_threadsafe(self.reply, pb.Frame(release=pb.Release(names=[name])))
        except RuntimeError:
            pass  # the loop is gone: the worker is exiting and the sender's pool goes with the daemon

    def take_inline(self, buffer_id: str, size: int) -> bytearray:
        return self.pieces.take(buffer_id, size)

    def discard_inline(self, buffer_id: str) -> None:
        self.pieces.discard(buffer_id)

    def close(self) -> None:
        self.pieces.clear()
        if self._batcher.task is not None:
            self._batcher.task.cancel()


_handlers: weakref.WeakKeyDictionary[grpc.aio.Server, set[asyncio.Task[Any]]] = weakref.WeakKeyDictionary()
"""Each server's running Link RPC tasks (the tasks gRPC runs the handlers in), for stop_server."""


def serve_links(
    server: grpc.aio.Server,
    on_frame: Callable[[pb.Frame, InboundLink], None],
    on_closed: Callable[[InboundLink], None] = lambda link: None,
    on_bad_frame: Callable[[BadFrame, InboundLink], None] | None = None,
) -> None:
    """Register the DataPlane service on `server`, dispatching every inbound frame to `on_frame`.

    Frames that do not parse, and pieces that do not fit, go to `on_bad_frame`
    (by default logged); the link itself goes on.
    """

    def bad_frame(item: BadFrame, inbound: InboundLink) -> None:
        if on_bad_frame is not None:
            on_bad_frame(item, inbound)
        else:
            bad_frames_log.warning("ignoring %s from %s", item.error, inbound.peer or "a peer")

    handlers = _handlers.setdefault(server, set())

    async def link(request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        inbound = InboundLink(context)
        task = asyncio.current_task()
        if task is not None:  # the RPC's task: stop_server waits for it
            handlers.add(task)
            task.add_done_callback(handlers.discard)
        try:
            async for data in request_iterator:
                frames, bad = parse_batch(data)
                for item in bad:
                    bad_frame(item, inbound)
                for frame in frames:
                    body = frame.WhichOneof("body")
                    if body == "piece":
                        error = inbound.pieces.add(frame.request_id, frame.piece)
                        if error is not None:
                            bad_frame(BadFrame(frame.request_id, error), inbound)
                    elif body == "hello":
                        inbound.peer = frame.hello.peer
                    else:
                        try:
                            on_frame(frame, inbound)
                        except Exception as error:  # noqa: BLE001 - one frame never ends the link
                            log.exception("data-plane frame for request %s failed", frame.request_id)
                            bad_frame(
                                BadFrame(frame.request_id, f"a frame that could not be handled ({error})"), inbound
                            )
        except asyncio.CancelledError:
            pass  # the server is stopping; the peer sees the link break and re-dials later
        finally:
            inbound.close()
            on_closed(inbound)

    handler = grpc.stream_stream_rpc_method_handler(link, request_deserializer=_identity, response_serializer=_identity)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("stagevisor.v1.DataPlane", {"Link": handler}),)
    )


async def stop_server(server: grpc.aio.Server, settle: float = 1.0) -> None:
    """Stop a data-plane server and let the RPC tasks it cancelled finish.

    grpc.aio runs each RPC's handler in a task that outlives `server.stop()` by a
    few loop iterations; if `asyncio.run` exits first it cancels that task and grpc
    logs the cancellation as an unhandled error on every clean shutdown. serve_links
    records those tasks (each handler's current task); this waits for them.
    """
    await server.stop(0)
    leftovers = [task for task in _handlers.get(server, ()) if not task.done()]
    if leftovers:
        await asyncio.wait(leftovers, timeout=settle)


def _describe(error: BaseException | None) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return repr(error)


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether a link broke because this process hit its descriptor limit (gRPC reports EMFILE as text)."""
    if isinstance(error, OSError) and error.errno == errno.EMFILE:
        return True
    return os.strerror(errno.EMFILE) in _describe(error)
