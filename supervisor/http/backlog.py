"""How much of a response its client has not taken yet: the connection's write buffer plus its socket's send queue.

A write to a slow client waits until the buffers in front of it drain; on
Linux the kernel's share can grow to megabytes (net.ipv4.tcp_wmem), so one
ASGI `send` of a client reading 20 KB/s can wait a minute while it reads all
along. The request's guard (`RequestGuard.send`) reads this backlog while a
write waits, and counts the client idle only while it does not fall.

uvicorn gives an ASGI app no handle on its connection, so the HTTP protocol
(connections.py) names its transport, `serving(transport)`, while it parses
what the client sent: the tasks it starts then (a request's ASGI call, a
WebSocket session) inherit it, and a response finds it with `current()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import functools
import socket
import struct
import sys
from typing import Any, Iterator

from stagevisor.supervisor.dataplane.limits import Backlog

_OUTQ: int | None
if sys.platform == "linux":  # SIOCOUTQ (linux/sockios.h) has TIOCOUTQ's number; Python names only the latter
    import termios

    _OUTQ = termios.TIOCOUTQ
else:
    _OUTQ = None

_transport: contextvars.ContextVar[asyncio.WriteTransport | None] = contextvars.ContextVar(
    "stagevisor_http_transport", default=None
)


@contextlib.contextmanager
def serving(transport: asyncio.WriteTransport) -> Iterator[None]:
    """Name `transport` as the connection of every task started inside this block (and of what they start)."""
    token = _transport.set(transport)
    try:
        yield
    finally:
        _transport.reset(token)


def current() -> Backlog | None:
    """A reader of the backlog of the connection this task serves; None when no connection was named (an app
    called without the daemon's HTTP protocol, as in tests): its writes are then bounded as a whole."""
    transport = _transport.get()
    return None if transport is None else functools.partial(unsent_bytes, transport)


def reset_stalled() -> None:
    """Reset (RST) the connection this task serves: its client read nothing for --stream-idle-timeout, and its
    response was cut. Closed instead, the connection would wait to flush what is buffered for it, holding its
    descriptor and a place under the connection cap until the client reads again or goes away (for ever, for a
    client that stays and reads nothing). No-op where no connection was named (`current`)."""
    transport = _transport.get()
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # Without a zero linger the kernel keeps the socket past its close, its FIN queued behind the data the
        # client does not take, and the client's side stays open.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def unsent_bytes(transport: asyncio.WriteTransport) -> int | None:
    """Bytes written to `transport` that its peer has not acknowledged: the transport's own buffer, plus on
    Linux the socket's send queue (sent but unacknowledged bytes included). None when that queue cannot be
    read (the socket is closed, or is not one), so a reading never mixes the two sums.

    Elsewhere the transport's buffer alone: it shrinks only when the kernel takes more, which it does as the
    peer acknowledges what it holds, so a fall is still the client reading, only seen in coarser steps."""
    buffered = transport.get_write_buffer_size()
    if _OUTQ is None:
        return buffered
    queued = socket_unsent(transport.get_extra_info("socket"))
    return None if queued is None else buffered + queued


def socket_unsent(sock: Any) -> int | None:
    """The bytes in `sock`'s send queue (Linux SIOCOUTQ), or None where they cannot be read."""
    if _OUTQ is None or sock is None:
        return None
    try:
        fd = sock.fileno()
        if fd < 0:
            return None
        return int.from_bytes(fcntl.ioctl(fd, _OUTQ, bytes(4)), sys.byteorder, signed=True)
    except (OSError, ValueError):
        return None
