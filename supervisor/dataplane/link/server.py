"""The listening side of links: `serve_links` registers the DataPlane service; an InboundLink per peer's stream.

Frames arrive through the endpoint's `on_frame` (a worker's, or the gateway's); the link answers on the same
stream with credit frames (merged per stream and batch) and with releases of
the pooled shared buffers its frames carried. A link never dies of what a peer
wrote: a frame that does not parse, a piece that does not fit or a frame whose
handling raised goes to `on_bad_frame`, and the link goes on.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any, AsyncIterator, Callable

import grpc

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.link.batcher import Batcher
from stagevisor.supervisor.dataplane.link.frames import BadFrame, bad_frames_log, frame_bytes, identity, parse_batch
from stagevisor.supervisor.dataplane.link.pieces import PieceAssembler

# The link's logger: what the listening side logs keeps the logger name it was always logged under.
log = logging.getLogger("stagevisor.supervisor.dataplane.link")


class InboundLink:
    """The listening side of one link: frames arrive through its endpoint; `reply` sends credits back.

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
        self._batcher = Batcher(context.write, self._gather_credits)
        self._batcher.start().add_done_callback(_writer_ended)

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

    async def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every reply queued so far was written; False if not."""
        deadline = self._loop.time() + timeout
        while not self._batcher.idle:
            if self._loop.time() > deadline or self._batcher.task is None or self._batcher.task.done():
                return False
            await asyncio.sleep(0.002)
        return True

    def take_inline(self, buffer_id: str, size: int) -> bytearray:
        return self.pieces.take(buffer_id, size)

    def discard_inline(self, buffer_id: str) -> None:
        self.pieces.discard(buffer_id)

    def close(self) -> None:
        self.pieces.clear()
        self._batcher.discard()

    async def finish(self) -> None:
        """After `close`: wait until the write under way (if any) is done, for the RPC must not end with one
        cancelled half-way (gRPC fails that with GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, logged as an error)."""
        await self._batcher.stop(WRITE_SETTLE)


def _writer_ended(task: asyncio.Task[None]) -> None:
    """An inbound link's writer ended: a reply written as the peer went away failed, and the link ends with it."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("data-plane reply not written: %r", task.exception())


WRITE_SETTLE = 1.0
"""Seconds an inbound link that ended waits for the reply being written to end (a peer that is gone fails it at
once) before it cancels it."""

_handlers: weakref.WeakKeyDictionary[grpc.aio.Server, set[asyncio.Task[Any]]] = weakref.WeakKeyDictionary()
"""Each server's running Link RPC tasks (the tasks gRPC runs the handlers in), for stop_server."""


def serve_links(
    server: grpc.aio.Server,
    on_frame: Callable[[pb.Frame, InboundLink], None],
    on_closed: Callable[[InboundLink], None] = lambda link: None,
    on_bad_frame: Callable[[BadFrame, InboundLink], None] | None = None,
    on_hello: Callable[[InboundLink], None] = lambda link: None,
) -> None:
    """Register the DataPlane service on `server`, dispatching every inbound frame to `on_frame`; `on_hello` learns
    who dialled each link (its `peer`), `on_closed` when it ends.

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
                        on_hello(inbound)
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
            try:
                await inbound.finish()
            except asyncio.CancelledError:
                pass  # the server is stopping, as above

    handler = grpc.stream_stream_rpc_method_handler(link, request_deserializer=identity, response_serializer=identity)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("stagevisor.v1.DataPlane", {"Link": handler}),)
    )


async def stop_server(server: grpc.aio.Server, settle: float = 1.0) -> None:
    """End the links it serves, stop a data-plane server, and let the RPC tasks it cancelled finish.

    A link's handler still reading when the server stops touches a stopped server, which grpc.aio logs as
    `WARNING Aborting method [/stagevisor.v1.DataPlane/Link] due to server stop.`: so the handlers are
    cancelled first and return (each peer reads the end of its link) while the server still runs.
    grpc.aio runs each RPC's handler in a task that outlives `server.stop()` by a
    few loop iterations; if `asyncio.run` exits first it cancels that task and grpc
    logs the cancellation as an unhandled error on every clean shutdown. serve_links
    records those tasks (each handler's current task); this waits for them.
    """
    await _settle(server, settle, cancel=True)
    await server.stop(0)
    await _settle(server, settle)  # a link a peer dialled as the others ended, which the stop cancelled


async def _settle(server: grpc.aio.Server, settle: float, cancel: bool = False) -> None:
    """Wait up to `settle` seconds for the server's Link handlers to return, cancelling them first if `cancel`."""
    leftovers = [task for task in _handlers.get(server, ()) if not task.done()]
    for task in leftovers if cancel else ():
        task.cancel()
    if leftovers:
        await asyncio.wait(leftovers, timeout=settle)
