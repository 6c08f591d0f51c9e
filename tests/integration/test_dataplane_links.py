"""A data-plane link between two endpoints on one event loop: frame order and merged credits.

Real gRPC over a unix socket in a temporary directory, one process.
"""

from __future__ import annotations

import asyncio

import grpc

from stagevisor.supervisor._proto import dataplane_pb2 as pb
import pytest

from stagevisor.supervisor.dataplane.link.outbound import (
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    FrameTooLarge,
    LinkPool,
    OutboundLink,
)
from stagevisor.supervisor.dataplane.link.frames import frame_bytes
from stagevisor.supervisor.dataplane.link.server import serve_links, stop_server

WAIT = 10.0


def chunk(request_id: str, index: int) -> pb.Frame:
    return pb.Frame(request_id=request_id, src="a", dst="b", chunk=pb.Chunk(value=pb.Value(integer=index)))


async def link_server(address: str, on_frame) -> grpc.aio.Server:
    """A started gRPC server taking data-plane links at `address`, each frame to `on_frame`."""
    server = grpc.aio.server(options=GRPC_OPTIONS)
    serve_links(server, on_frame)
    server.add_insecure_port(address)
    await server.start()
    return server


async def until(event: asyncio.Event, condition) -> None:
    async def wait() -> None:
        while not condition():
            event.clear()
            await event.wait()

    await asyncio.wait_for(wait(), WAIT)


def test_frames_arrive_in_order_and_the_credits_of_a_batch_come_back_merged_per_stream(tmp_path):
    address = f"unix:{tmp_path}/g.sock"

    async def main():
        arrived, answered = asyncio.Event(), asyncio.Event()
        frames: list[pb.Frame] = []
        replies: list[pb.Frame] = []

        def on_frame(frame: pb.Frame, inbound) -> None:
            frames.append(frame)
            arrived.set()
            inbound.reply(
                pb.Frame(request_id=frame.request_id, src=frame.src, dst=frame.dst, credit=pb.Credit(chunks=1))
            )
            if frame.chunk.value.integer == 0:
                inbound.reply(
                    pb.Frame(request_id=frame.request_id, cancel=pb.Cancel(reason="other replies go as sent"))
                )

        def on_reply(frame: pb.Frame) -> None:
            replies.append(frame)
            answered.set()

        server = await link_server(address, on_frame)
        link = OutboundLink(address, "sender", on_reply, lambda link, error: answered.set())
        try:
            for index in range(300):
                link.send(chunk(f"r{index % 3}", index))  # queued in one loop turn: they go out batched
            await until(arrived, lambda: len(frames) == 300)
            credits = lambda: [f for f in replies if f.WhichOneof("body") == "credit"]  # noqa: E731
            await until(answered, lambda: sum(f.credit.chunks for f in credits()) == 300)
            assert [f.chunk.value.integer for f in frames] == list(range(300))
            for stream in ("r0", "r1", "r2"):
                assert sum(f.credit.chunks for f in credits() if f.request_id == stream) == 100
            assert {(f.src, f.dst) for f in credits()} == {("a", "b")}
            assert len(credits()) < 300  # merged: one Credit frame per stream per batch, not one per chunk
            assert [f.cancel.reason for f in replies if f.WhichOneof("body") == "cancel"] == [
                "other replies go as sent"
            ]
            assert not link.broken
        finally:
            await link.close()
            await stop_server(server)

    asyncio.run(main())


def test_a_frame_over_the_message_limit_is_refused_before_it_is_sent_and_the_link_goes_on(tmp_path):
    """A stage returns a str larger than a link message may be: written, the frame broke the link (gRPC
    refuses it), failing every request on it as `the worker serving stage 'b' became unreachable`. It is
    refused with FrameTooLarge instead, which fails only its own request, and the next frame arrives."""
    address = f"unix:{tmp_path}/g.sock"

    async def main():
        arrived = asyncio.Event()
        frames: list[pb.Frame] = []
        broken: list[BaseException] = []

        def on_frame(frame: pb.Frame, inbound) -> None:
            frames.append(frame)
            arrived.set()

        server = await link_server(address, on_frame)
        link = OutboundLink(address, "sender", lambda frame: None, lambda link, error: broken.append(error))
        try:
            huge = pb.Frame(request_id="r1", src="a", dst="b")
            huge.submit.data.text = "x" * MAX_MESSAGE_BYTES
            with pytest.raises(FrameTooLarge, match="its output for stage 'b' is 64 MiB inside one frame"):
                await asyncio.wait_for(link.send_async(huge), WAIT)
            await asyncio.wait_for(link.send_async(chunk("r2", 7)), WAIT)
            await until(arrived, lambda: frames)
            assert [f.request_id for f in frames] == ["r2"] and not link.broken and not broken
        finally:
            await link.close()
            await stop_server(server)

    asyncio.run(main())


def test_a_send_cancelled_while_its_inline_pieces_drain_hands_its_pooled_buffers_back(tmp_path, monkeypatch):
    """A frame naming a pooled shared buffer, after inline pieces, on a link over its high-water mark: the
    sender is cancelled (its request ended) while it waits for the link to drain between pieces. The frame
    never goes out, so no peer would ever release the buffer: it is handed back at once, not held until the
    link closes."""
    from stagevisor.supervisor.dataplane.link import batcher as link_batcher
    from stagevisor.supervisor.dataplane.out_of_line import OutOfLine

    monkeypatch.setattr(link_batcher, "HIGH_WATER_BYTES", 0)  # every piece waits for the link to drain
    address = f"unix:{tmp_path}/g.sock"

    class Pool:
        def __init__(self) -> None:
            self.released: list[str] = []
            self.dropped: list[str] = []

        def release(self, names) -> None:
            self.released.extend(names)

        def drop(self, names) -> None:
            self.dropped.extend(names)

    async def main():
        server = await link_server(address, lambda frame, inbound: None)
        pool = Pool()
        link = OutboundLink(address, "sender", lambda frame: None, lambda link, error: None, buffers=pool)
        try:
            out = OutOfLine(segments=["seg-1"], pieces=[("buf-1", memoryview(bytes(300_000)))])
            sending = asyncio.ensure_future(link.send_async(chunk("r1", 1), out))
            await asyncio.sleep(0)  # it holds the buffer, queues its first piece and waits for the link to drain
            assert link.holds == {"seg-1"}
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            assert link.holds == set() and pool.released == ["seg-1"] and not link.broken
        finally:
            await link.close()
            await stop_server(server)
        assert pool.dropped == []  # nothing left held for the close to drop

    asyncio.run(main())


def test_a_link_its_peer_ends_while_replies_are_written_ends_without_a_grpc_error(tmp_path, caplog):
    """
    1. peers dial a link, send a frame whose handling queues a few MB of replies, and go away at once (as a worker
       that stops, or is killed, does while the gateway writes it Release frames);
    2. each link ends quietly. The server cancelled its writer half-way through a write and returned, and gRPC
       logged ExecuteBatchError GRPC_CALL_ERROR_TOO_MANY_OPERATIONS at ERROR for most of them.
    """
    address = f"unix:{tmp_path}/g.sock"
    reply = pb.Frame(request_id="r", release=pb.Release(names=["x" * 100] * 2000))

    def on_frame(frame: pb.Frame, inbound) -> None:
        for _ in range(20):
            inbound.reply(reply)

    async def main():
        server = await link_server(address, on_frame)
        try:
            for index in range(40):
                async with grpc.aio.insecure_channel(address) as channel:
                    call = channel.stream_stream(
                        "/stagevisor.v1.DataPlane/Link", request_serializer=bytes, response_deserializer=bytes
                    )()
                    await call.write(frame_bytes(pb.Frame(request_id="r", cancel=pb.Cancel(reason="bye"))))
                    await call.done_writing()
                    await asyncio.sleep(0.001 * (index % 5))
                    call.cancel()
            await asyncio.sleep(0.5)  # the last links' handlers end
        finally:
            await stop_server(server)

    caplog.set_level("ERROR")
    asyncio.run(main())
    errors = [r.getMessage() for r in caplog.records if r.levelno >= 40]
    assert errors == []


def test_a_server_stopped_while_its_peers_links_are_open_ends_them_without_a_grpc_warning(tmp_path, caplog):
    """
    1. a worker keeps its link to the gateway open (as every worker does while the daemon runs) and has sent a
       frame on it;
    2. the daemon stops its data plane (a clean `stagevisor stop`);
    3. the link ends, and nothing is logged at WARNING: the server stopped with the link's handler still reading,
       and grpc logged `Aborting method [/stagevisor.v1.DataPlane/Link] due to server stop.` on most clean stops.
    """

    async def main(address: str) -> None:
        arrived = asyncio.Event()
        ended: list[BaseException] = []

        def on_frame(frame: pb.Frame, inbound) -> None:
            inbound.reply(pb.Frame(request_id=frame.request_id, src="a", dst="b", credit=pb.Credit(chunks=1)))
            arrived.set()

        server = await link_server(address, on_frame)
        link = OutboundLink(address, "worker", lambda frame: None, lambda link, error: ended.append(error))
        try:
            link.send(chunk("r", 0))
            await asyncio.wait_for(arrived.wait(), WAIT)
        finally:
            await stop_server(server)
            await asyncio.sleep(0.1)  # the peer reads the end of its link
            await link.close()

    caplog.set_level("WARNING")
    for index in range(3):  # without the fix, each round logged the warning nearly every time
        asyncio.run(main(f"unix:{tmp_path}/g{index}.sock"))
    warnings = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= 30]
    assert warnings == []


def test_a_sender_told_its_peer_leaves_sends_nothing_more_and_ends_its_side_once_what_it_queued_is_written(tmp_path):
    """
    1. a sender queues 300 frames to a worker that answers its hello with Leaving (it stops: a scale-down);
    2. every one of them is read there, and the sender then ends its side of the link, so the worker, which waits
       for that before it stops its server, drops nothing unread (before, a frame of a request routed there just
       before the worker left the rotation could be dropped with the server, and the request waited for the idle
       timeout);
    3. a frame sent after Leaving is not written, and the pool dials a new link for the address.
    """
    address = f"unix:{tmp_path}/g.sock"
    leaving = pb.Frame(leaving=pb.Leaving(finished=["r0"], message="stopping"))

    async def main():
        arrived, ended = asyncio.Event(), asyncio.Event()
        frames: list[pb.Frame] = []
        closed = []

        def on_frame(frame: pb.Frame, inbound) -> None:
            frames.append(frame)
            arrived.set()

        def on_closed(inbound) -> None:
            closed.append(inbound.peer)
            ended.set()

        server = grpc.aio.server(options=GRPC_OPTIONS)
        serve_links(server, on_frame, on_closed=on_closed, on_hello=lambda inbound: inbound.reply(leaving))
        server.add_insecure_port(address)
        await server.start()
        broke = asyncio.Event()
        pool = LinkPool("sender", lambda frame: None, lambda link, error: broke.set())
        try:
            link = pool.get(address)
            for index in range(300):
                link.send(chunk(f"r{index % 3}", index))
            await until(ended, lambda: closed == ["sender"])  # the sender ended the link; the worker read to its end
            assert [f.chunk.value.integer for f in frames] == list(range(300))
            assert link.leaving and link.left == frozenset({"r0"})
            link.send(chunk("r9", 300))  # after Leaving: not written
            assert pool.get(address) is not link  # the next frame to the address goes on a new link
            await asyncio.wait_for(broke.wait(), WAIT)  # the old link ends once the worker's side does
            assert [f.chunk.value.integer for f in frames] == list(range(300))
        finally:
            await pool.close()
            await stop_server(server)

    asyncio.run(main())
