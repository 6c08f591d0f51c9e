"""The dialling side of a link (OutboundLink, one per peer address; LinkPool, a node's links by address).

A link is dialled on its first frame; frames queued while a write is in flight
go out together as one gRPC message. A link that breaks is dropped from its
pool, and the next frame to that address dials again, so a restarted peer on
the same address is found. Pooled shared buffers are held by the link their
frame went out on until the peer releases them; when the link breaks, the
buffers it still holds are dropped, never leaked. A peer that says it leaves
gets no frame more on its link, which ends its side once what it queued before
is written (the package's docstring says why).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from typing import Awaitable, Callable, Iterable, Protocol, Sequence

import grpc

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.out_of_line import OutOfLine, piece_frames
from stagevisor.supervisor.dataplane.link.batcher import Batcher
from stagevisor.supervisor.dataplane.link.frames import bad_frames_log, frame_bytes, identity, parse_batch
from stagevisor.supervisor.dataplane.peers import Dial, PeerDirectory

__all__ = [
    "CHANNEL_OPTIONS",
    "GRPC_OPTIONS",
    "LINK_METHOD",
    "Buffers",
    "LinkPool",
    "OutboundLink",
    "out_of_descriptors",
]

log = logging.getLogger("stagevisor.supervisor.dataplane.link")  # the link's logger, both sides

LINK_METHOD = "/stagevisor.v1.DataPlane/Link"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Each link gets its own subchannel: gRPC otherwise shares subchannels per
# address process-wide, and one that failed while a peer restarted stays in
# reconnect backoff, refusing the fresh link to the restarted peer.
LEAVE_SETTLE = 1.0
"""Seconds a link whose peer leaves waits for the frames queued before to be written before it ends its side, and
a leaving peer waits for its links to end (`StageRuntime.settle`), before it stops regardless."""

CHANNEL_OPTIONS = GRPC_OPTIONS + [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class FrameTooLarge(ValueError):
    """A frame over the link's message limit (MAX_MESSAGE_BYTES), refused before it was queued.

    Recoverable: only its request fails. What makes a frame that large is data that travels inside it
    (strings, lists of many small items); arrays and bytes go out of line whatever their size.
    """

    def __init__(self, frame: pb.Frame, size: int) -> None:
        body = frame.WhichOneof("body")
        what = {"submit": "its output", "end": "its final data", "chunk": "a chunk it streamed"}.get(body, body)
        to = f"stage {frame.dst!r}" if frame.dst else "the client"
        super().__init__(
            f"{what} for {to} is {size / 2**20:.0f} MiB inside one frame, "
            f"over the data plane's limit of {MAX_MESSAGE_BYTES // 2**20} MiB; send large data as a numpy "
            "array or bytes, which travel out of line, not as str or lists of many items"
        )


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
        self.leaving = False
        """The peer said it stops (a Leaving frame): this link takes no frame more, and ends its side once what was
        queued before is written (`_end_writing`)."""
        self._closing = False
        self._on_frame = on_frame
        self._on_broken = on_broken
        self._buffers = buffers
        self.holds: set[str] = set()
        """Pooled shared buffers (the tokens of their writes) sent on this link and not yet released by the peer."""
        self.left: frozenset[str] = frozenset()
        """Requests the peer's work on had ended when it stopped (its Leaving frame, read before the link broke):
        they do not depend on it any more."""
        if dial is not None and dial.credentials is not None:
            self._channel = grpc.aio.secure_channel(
                dial.target, dial.credentials, options=CHANNEL_OPTIONS + dial.options
            )
        else:
            self._channel = grpc.aio.insecure_channel(
                dial.target if dial is not None else address, options=CHANNEL_OPTIONS
            )
        self._call = self._channel.stream_stream(
            LINK_METHOD, request_serializer=identity, response_deserializer=identity
        )(metadata=dial.metadata if dial is not None and dial.metadata else None)
        self._batcher = Batcher(self._call.write)
        self._batcher.start().add_done_callback(self._task_ended)
        reader = asyncio.get_running_loop().create_task(self._read())
        reader.add_done_callback(self._task_ended)
        self._reader: asyncio.Task[None] | None = reader
        self.send(pb.Frame(hello=pb.Hello(peer=peer_name)))

    def send(self, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        """Queue a frame (after the pieces of its inline buffers); it is written with whatever else is pending.
        Dropped once the peer is leaving: it answered or failed every request it took, and takes no new one."""
        if self.leaving:
            self._dropped(frame, out)
            return
        if out:
            self._hold(out.segments)
            for piece in piece_frames(frame.request_id, out.pieces):
                self._batcher.push(frame_bytes(piece))
        self._batcher.push(frame_bytes(frame))

    async def send_async(self, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        """Queue a frame, waiting while the link is over its high-water mark (backpressure).

        Raises FrameTooLarge, before anything of the frame is queued, when it is over the link's message limit:
        written, it would break the link and fail every request on it. The caller still owns `out`.
        """
        if self.leaving:
            self._dropped(frame, out)
            return
        data = frame_bytes(frame)
        if len(data) > MAX_MESSAGE_BYTES:
            raise FrameTooLarge(frame, len(data))
        batcher = self._batcher
        if out is not None and (out.segments or out.pieces):
            self._hold(out.segments)
            try:
                for piece in piece_frames(frame.request_id, out.pieces):
                    batcher.push(frame_bytes(piece))
                    await batcher.wait_drained()
            except BaseException:
                # Cancelled while the link drained: the frame naming the pooled buffers never goes out, so no peer
                # will release them; they are free for reuse now (held, they stayed out of the pool until the
                # link closed).
                self._released(out.segments)
                raise
        batcher.push(data)
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

    def _dropped(self, frame: pb.Frame, out: OutOfLine | None) -> None:
        """A frame sent after the peer said it leaves: not written; the pooled buffers it names are nobody's."""
        log.debug("not sending a %s frame to %s, which is leaving", frame.WhichOneof("body"), self.address)
        if out is not None and out.segments and self._buffers is not None:
            self._buffers.release(out.segments)

    async def _end_writing(self) -> None:
        """The peer leaves: once the frames queued before its Leaving frame are written, end this side of the
        stream, so the peer reads every one of them before it stops. Not when they could not be written in time:
        then the peer stops after its own wait, as a peer that never said so would."""
        if not await self.flush(LEAVE_SETTLE) or self.broken or self._call is None:
            return
        try:
            await self._call.done_writing()
        except Exception as error:  # noqa: BLE001 - the link breaking says the rest
            log.debug("could not end the link to %s: %r", self.address, error)

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
                body = frame.WhichOneof("body")
                if body == "release":
                    self._released(frame.release.names)
                    continue
                if body == "leaving":
                    self.left = frozenset(frame.leaving.finished)
                    if not self.leaving:
                        self.leaving = True
                        _background(self._end_writing())
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
        """The link to `address`: a new one when there is none, it broke, or its peer is leaving (a worker that
        takes the address next, or the leaving one, which refuses what it would no longer finish)."""
        link = self._links.get(address)
        if link is None or link.broken or link.leaving:
            dial = self.directory.dial(address) if self.directory else None
            link = OutboundLink(address, self.peer_name, self._on_frame, self._broken, self._buffers, dial)
            self._links[address] = link
        return link

    def send(self, address: str, frame: pb.Frame, out: OutOfLine | None = None) -> None:
        self.get(address).send(frame, out)

    def send_if_linked(self, address: str, frame: pb.Frame) -> bool:
        """Send on a live link only, never dialling: a peer whose link broke has nothing to be told."""
        link = self._links.get(address)
        if link is None or link.broken or link.leaving:
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


def _describe(error: BaseException | None) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return repr(error)


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether a link broke because this process hit its descriptor limit (gRPC reports EMFILE as text)."""
    if isinstance(error, OSError) and error.errno == errno.EMFILE:
        return True
    return os.strerror(errno.EMFILE) in _describe(error)
