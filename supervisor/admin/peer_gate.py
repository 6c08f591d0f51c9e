"""Admin access by who the caller is: a unix-socket front that lets a connection through only from allowed uids.

gRPC does not show a server who is on the other end of a unix socket (its
auth context is empty there), and an abstract socket (`unix-abstract:NAME`)
has no file permissions at all. So the admin address is a listener of our
own: each accepted connection's `SO_PEERCRED` uid is checked (the daemon's
uid and root by default, plus `--admin-allow-uid`), and an allowed
connection is spliced byte for byte to the gRPC admin server, which listens
on a socket in the daemon's private (0700) run directory. A refused one is
closed before it reads a byte, and logged with its uid and pid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from stagevisor.supervisor.addresses import Listener

log = logging.getLogger("stagevisor.admin")

MAX_UID = 2**32 - 2
"""The largest user id: uid_t is 32 bits, and (uid_t)-1 means "no user" to the kernel."""
MAX_CONNECTIONS = 64
"""Admin connections spliced at once (each holds two descriptors); more are closed at once, logged."""
CHUNK = 64 * 1024


@dataclass(frozen=True)
class PeerCredentials:
    """Who is on the other end of a unix socket, as the kernel recorded it at connect()."""

    pid: int
    uid: int
    gid: int


def allowed_uid(value: str) -> int:
    """An `--admin-allow-uid` value: a user id (0 to MAX_UID); ValueError naming the range otherwise (a typo would
    open the admin socket's mode to others for a user that cannot exist)."""
    try:
        uid = int(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a user id (a number; `id -u NAME` prints one)") from None
    if not 0 <= uid <= MAX_UID:
        raise ValueError(f"{uid} is not a user id: user ids run from 0 to {MAX_UID}")
    return uid


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """SO_PEERCRED of a connected unix socket (Linux)."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return PeerCredentials(pid, uid, gid)


def default_allowed_uids(extra: tuple[int, ...] = ()) -> frozenset[int]:
    """The daemon's own uid, root, and the operator's `--admin-allow-uid` values."""
    return frozenset({os.getuid(), 0, *extra})


def abstract_listener(address: str) -> socket.socket:
    """A listening socket for `unix-abstract:NAME` (abstract namespace); OSError when the name is taken."""
    assert address.startswith("unix-abstract:"), address
    sock = Listener(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind("\0" + address[len("unix-abstract:") :])
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def bind_path_listener(path: Path, allowed_uids: frozenset[int]) -> socket.socket:
    """A listening socket bound at `path`, its mode set before anyone can connect through its final name.

    0600 when only the daemon's user and root may connect; 0666 when the
    operator let other uids in (the gate then decides, by credentials).
    """
    sock = Listener(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o600 if allowed_uids <= {os.getuid(), 0} else 0o666)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class PeerGate:
    """Accepts on `listener`, lets allowed uids through to the unix socket at `target`, closes the rest."""

    def __init__(
        self, listener: socket.socket, target: Path, allowed_uids: frozenset[int], *, name: str = "admin API"
    ) -> None:
        self.listener = listener
        self.target = target
        self.allowed_uids = allowed_uids
        self.name = name
        self.refused = 0
        """Connections closed because their uid is not allowed (tests and logs read it)."""
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.listener.setblocking(False)
        self._server = await asyncio.start_unix_server(self._accepted, sock=self.listener)

    async def stop(self) -> None:
        """Stop accepting and cut spliced connections (the gRPC server behind has stopped by now)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.listener.close()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # `stop` cut the connection and only waits for this task to end. Ending cancelled, it would make
            # asyncio's stream callback (Python 3.11) log an ERROR with a traceback on every such shutdown.
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = peer_credentials(writer.get_extra_info("socket"))
        if peer.uid not in self.allowed_uids:
            self.refused += 1
            log.warning(
                "%s: refused a connection from uid %d (pid %d): only uids %s may use it (--admin-allow-uid adds one)",
                self.name,
                peer.uid,
                peer.pid,
                ", ".join(map(str, sorted(self.allowed_uids))),
            )
            return
        if len(self._tasks) > MAX_CONNECTIONS:
            log.warning("%s: %d connections open; closing a new one from pid %d", self.name, MAX_CONNECTIONS, peer.pid)
            return
        inner_reader, inner_writer = await asyncio.open_unix_connection(str(self.target))
        try:
            pumps = [
                asyncio.ensure_future(_pump(reader, inner_writer)),
                asyncio.ensure_future(_pump(inner_reader, writer)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            inner_writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        data = await reader.read(CHUNK)
        if not data:
            return
        writer.write(data)
        await writer.drain()
