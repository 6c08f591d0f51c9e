"""Data-plane links on one host: the raw unix-socket transport, its fallback to gRPC, merged credits.

Real sockets in a temporary directory, one process (both ends on one event loop).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import grpc
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import link as link_module
from stagevisor.supervisor.dataplane.link import (
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    OutboundLink,
    frame_bytes,
    raw_link_path,
    serve_links,
    stop_server,
)

WAIT = 10.0


class Listener:
    """A data-plane server on `unix:<tmp>/g.sock` recording what arrives; replies a Credit per chunk."""

    def __init__(self, address: str, raw: bool = True) -> None:
        self.address = address
        self.raw = raw
        self.frames: list[pb.Frame] = []
        self.closed = 0
        self.arrived = asyncio.Event()

    async def start(self) -> None:
        self.server = grpc.aio.server(options=GRPC_OPTIONS)
        serve_links(self.server, self.on_frame, on_closed=self.on_closed,
                    address=self.address if self.raw else None)
        self.server.add_insecure_port(self.address)
        await self.server.start()

    def on_frame(self, frame: pb.Frame, inbound) -> None:
        self.frames.append(frame)
        self.arrived.set()
        if frame.WhichOneof("body") == "chunk":
            inbound.reply(pb.Frame(request_id=frame.request_id, src=frame.src, dst=frame.dst,
                                   credit=pb.Credit(chunks=1)))

    def on_closed(self, inbound) -> None:
        self.closed += 1

    async def wait_for(self, count: int) -> None:
        async def until() -> None:
            while len(self.frames) < count:
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(until(), WAIT)

    async def stop(self) -> None:
        await stop_server(self.server)


class Replies:
    def __init__(self) -> None:
        self.frames: list[pb.Frame] = []
        self.broken: list[BaseException] = []
        self.event = asyncio.Event()

    def on_frame(self, frame: pb.Frame) -> None:
        self.frames.append(frame)
        self.event.set()

    def on_broken(self, link, error: BaseException) -> None:
        self.broken.append(error)
        self.event.set()

    async def wait(self, condition) -> None:
        async def until() -> None:
            while not condition():
                self.event.clear()
                await self.event.wait()

        await asyncio.wait_for(until(), WAIT)


@pytest.fixture
def address(tmp_path):
    return f"unix:{tmp_path}/g.sock"


def chunk(request_id: str, index: int) -> pb.Frame:
    return pb.Frame(request_id=request_id, src="a", dst="b", chunk=pb.Chunk(value=pb.Value(integer=index)))


def test_raw_link_path_is_next_to_unix_addresses_only():
    assert raw_link_path("unix:/run/x/g0.sock") == "/run/x/g0.sock.link"
    assert raw_link_path("unix:///run/x/g0.sock") == "/run/x/g0.sock.link"
    assert raw_link_path("127.0.0.1:5000") is None
    assert raw_link_path("unix:/" + "d" * 120) is None  # would not fit a socket address: gRPC only


def test_frames_travel_the_raw_socket_in_order_and_credits_of_a_stream_come_back_merged(address):
    async def main():
        listener = Listener(address)
        await listener.start()
        replies = Replies()
        link = OutboundLink(address, "sender", replies.on_frame, replies.on_broken)
        try:
            for index in range(200):
                link.send(chunk("r1", index))  # queued in one loop turn: they go out batched
            await listener.wait_for(200)
            await replies.wait(lambda: sum(f.credit.chunks for f in replies.frames) >= 200)
            assert link.transport == "raw"
            assert [f.chunk.value.integer for f in listener.frames] == list(range(200))
            credits = [f for f in replies.frames if f.WhichOneof("body") == "credit"]
            assert sum(f.credit.chunks for f in credits) == 200
            assert len(credits) < 200  # merged: a batch's credits of one stream go back as one frame
            assert {(f.request_id, f.src, f.dst) for f in credits} == {("r1", "a", "b")}
        finally:
            await link.close()
            await listener.stop()
        assert not os.path.exists(raw_link_path(address))  # the listener removed its socket

    asyncio.run(main())


def test_a_peer_serving_only_grpc_is_reached_over_grpc(address):
    async def main():
        listener = Listener(address, raw=False)
        await listener.start()
        replies = Replies()
        link = OutboundLink(address, "sender", replies.on_frame, replies.on_broken)
        try:
            link.send(chunk("r1", 7))
            await listener.wait_for(1)
            await replies.wait(lambda: replies.frames)
            assert link.transport == "grpc"
            assert listener.frames[0].chunk.value.integer == 7
        finally:
            await link.close()
            await listener.stop()

    asyncio.run(main())


def test_stopping_the_listener_breaks_raw_links_so_senders_fail_their_requests(address):
    async def main():
        listener = Listener(address)
        await listener.start()
        replies = Replies()
        link = OutboundLink(address, "sender", replies.on_frame, replies.on_broken)
        try:
            link.send(chunk("r1", 1))
            await listener.wait_for(1)
            await listener.stop()
            await replies.wait(lambda: replies.broken)
            assert link.broken
        finally:
            await link.close()

    asyncio.run(main())


def test_a_batch_length_over_the_limit_ends_only_that_link(address):
    async def main():
        listener = Listener(address)
        await listener.start()
        replies = Replies()
        good = OutboundLink(address, "good", replies.on_frame, replies.on_broken)
        try:
            reader, writer = await asyncio.open_unix_connection(raw_link_path(address))
            writer.write(struct.pack("<I", MAX_MESSAGE_BYTES + 1) + b"x" * 64)
            assert await asyncio.wait_for(reader.read(), WAIT) == b""  # the listener hung up on it
            writer.close()
            good.send(chunk("r2", 5))
            await listener.wait_for(1)
            assert listener.frames[0].request_id == "r2" and not good.broken
        finally:
            await good.close()
            await listener.stop()

    asyncio.run(main())


def test_a_malformed_frame_on_the_raw_socket_spoils_only_itself(address):
    async def main():
        bad: list[str] = []
        server = grpc.aio.server(options=GRPC_OPTIONS)
        frames: list[pb.Frame] = []
        serve_links(server, lambda frame, inbound: frames.append(frame),
                    on_bad_frame=lambda item, inbound: bad.append(item.request_id), address=address)
        server.add_insecure_port(address)
        await server.start()
        try:
            reader, writer = await asyncio.open_unix_connection(raw_link_path(address))
            spoiled = b"\x0a\x02r1\xff"  # request id "r1", then a cut-off field: the frame does not parse
            batch = frame_bytes(chunk("r0", 0)) + b"\x0a" + bytes([len(spoiled)]) + spoiled + \
                frame_bytes(chunk("r2", 2))
            writer.write(struct.pack("<I", len(batch)) + batch)
            await writer.drain()
            for _ in range(500):
                if len(frames) + len(bad) >= 3:
                    break
                await asyncio.sleep(0.01)
            assert [f.request_id for f in frames] == ["r0", "r2"]
            assert bad == ["r1"]
            writer.close()
        finally:
            await stop_server(server)

    asyncio.run(main())


def test_a_stale_socket_is_replaced_and_anything_else_at_the_path_is_left_alone(address, caplog):
    path = raw_link_path(address)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()  # what a SIGKILLed worker leaves

    async def serve_and_stop() -> str:
        listener = Listener(address)
        await listener.start()
        replies = Replies()
        link = OutboundLink(address, "sender", replies.on_frame, replies.on_broken)
        try:
            link.send(chunk("r1", 1))
            await listener.wait_for(1)
            return link.transport
        finally:
            await link.close()
            await listener.stop()

    assert asyncio.run(serve_and_stop()) == "raw"
    with open(path, "w") as f:
        f.write("not a socket")
    try:
        assert asyncio.run(serve_and_stop()) == "grpc"
        assert "stay on gRPC" in caplog.text
        with open(path) as f:
            assert f.read() == "not a socket"
    finally:
        os.unlink(path)
    assert link_module._raw_listeners == {}
