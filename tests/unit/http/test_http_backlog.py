"""A connection's backlog, as a waiting write reads it: the transport's buffer plus the socket's send queue, and
the connection named to the tasks that serve it."""

from __future__ import annotations

import asyncio
import socket
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from stagevisor.supervisor.http import backlog

linux = pytest.mark.skipif(sys.platform != "linux", reason="the socket's send queue is read with Linux SIOCOUTQ")


@pytest.fixture
def pair():
    """Two connected sockets (AF_UNIX: no port), `ours` writing to `theirs`."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


def transport(buffered: int, sock: Any) -> Any:
    return SimpleNamespace(get_write_buffer_size=lambda: buffered, get_extra_info={"socket": sock}.get)


@linux
def test_the_send_queue_falls_as_the_peer_reads(pair):
    ours, theirs = pair
    ours.sendall(b"x" * 4000)
    queued = backlog.socket_unsent(ours)
    assert queued is not None and queued > 0
    got = 0
    while got < 4000:
        got += len(theirs.recv(4000))
    assert backlog.socket_unsent(ours) == 0


@linux
def test_the_backlog_counts_the_transport_buffer_and_the_send_queue(pair):
    ours, _ = pair
    ours.sendall(b"x" * 4000)
    queued = backlog.socket_unsent(ours)
    assert queued is not None
    assert backlog.unsent_bytes(transport(500, ours)) == 500 + queued


@linux
def test_a_closed_socket_has_no_backlog_rather_than_the_buffer_alone():
    """A reading of the buffer alone after one of both would look like the client reading."""
    ours, theirs = socket.socketpair()
    ours.close()
    theirs.close()
    assert backlog.unsent_bytes(transport(500, ours)) is None
    assert backlog.unsent_bytes(transport(500, None)) is None


def test_tasks_started_while_a_connection_is_served_read_its_backlog_and_others_none():
    async def run():
        async def reading() -> int | None:
            unsent = backlog.current()
            return None if unsent is None else unsent()

        connection = transport(700, None)
        connection.get_extra_info = {}.get
        with backlog.serving(connection):
            inside = asyncio.create_task(reading())
        outside = asyncio.create_task(reading())
        return await inside, await outside

    inside, outside = asyncio.run(run())
    assert outside is None
    assert inside == (None if sys.platform == "linux" else 700)  # no socket: on Linux, no reading rather than half
