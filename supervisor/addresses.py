"""Default endpoints: where the daemon listens and where the CLI looks for it; the sockets it listens on with
asyncio (`Listener`)."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
from pathlib import Path
from typing import Any

from stagevisor.supervisor import envs
from stagevisor.supervisor.numbers import whole_number

DEFAULT_LISTEN = "127.0.0.1:50551"
"""The public endpoint (Synthesis, health) of `stagevisor serve`; `synthesize --address` defaults to it."""

DEFAULT_HTTP = "127.0.0.1:8000"
"""The HTTP API (OpenAI-compatible speech, health, playground) of `stagevisor serve`; `--http none` turns it off."""


def runtime_dir() -> Path:
    """The per-user directory holding the admin socket and worker sockets (mode 0700).

    $STAGEVISOR_RUNTIME_DIR wins; else $XDG_RUNTIME_DIR/stagevisor; else /tmp/stagevisor-<uid>.
    """
    explicit = envs.RUNTIME_DIR.get()
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "stagevisor"
    return Path(f"/tmp/stagevisor-{os.getuid()}")


def default_admin_address() -> str:
    """`unix:<runtime dir>/admin.sock`, the admin endpoint `serve` binds and the CLI dials."""
    return f"unix:{runtime_dir() / 'admin.sock'}"


def is_unix(address: str) -> bool:
    """True for `unix:PATH`, `unix://PATH` and `unix-abstract:NAME` addresses."""
    return address.startswith(("unix:", "unix-abstract:"))


def unix_path(address: str) -> Path | None:
    """The path of a `unix:PATH` or `unix://PATH` address; None for any other (`unix-abstract:NAME` included)."""
    if address.startswith("unix://"):
        return Path(address[len("unix://") :])
    if address.startswith("unix:"):
        return Path(address[len("unix:") :])
    return None


def is_loopback(address: str) -> bool:
    """True for unix sockets and loopback host:port addresses."""
    if is_unix(address):
        return True
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_port(address: str) -> tuple[str, int] | None:
    """`HOST:PORT` or `[v6]:PORT` -> (host, port), the port 0 to 65535 in ASCII digits; None for anything else."""
    host, sep, digits = address.rpartition(":")
    host = host.strip("[]")
    port = whole_number(digits)
    if not sep or not host.strip() or port is None or port > 65535:
        return None
    return host, port


def listen_problem(address: str) -> str | None:
    """Why `address` is not one a server can listen on, or None: `unix:PATH` (a path), `unix-abstract:NAME` (a
    name) or `HOST:PORT` (a port from 0 to 65535; gRPC would bind 99999 as 34463 without a word)."""
    for prefix in ("unix://", "unix:", "unix-abstract:"):
        if address.startswith(prefix):
            if address[len(prefix) :].strip():
                return None
            return f"{prefix} needs a {'name' if prefix == 'unix-abstract:' else 'path'} after it"
    if host_port(address) is None:
        return "it is not HOST:PORT with a port from 0 to 65535 (e.g. 127.0.0.1:50551), unix:PATH or unix-abstract:NAME"
    return None


def bind_failure(address: str, error: OSError) -> str:
    """Why binding `address` (HOST:PORT) failed with `error`, in words an operator can act on; the one wording of
    a port in use, whichever server (--listen, --http, --metrics) bound it."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if error.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is already in use (another stagevisor daemon or another program)"
    if error.errno == errno.EACCES:
        return f"permission denied for port {port} (ports below 1024 need privileges)"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this host"
    return f"cannot bind {address}: {error.strerror or error}"


def dial_problem(address: str) -> str | None:
    """Why a client cannot dial `address`, or None: what a server listens on, but port 0 (a server's request for
    any free port) names no endpoint."""
    problem = listen_problem(address)
    if problem is None and (bound := host_port(address)) is not None and bound[1] == 0:
        return "port 0 names no endpoint; give the port the daemon bound (its log names it)"
    return problem


def dial_address(value: str) -> str:
    """argparse type of a client's --address and --admin-address: refused with why before anything is dialled
    (gRPC would dial 127.0.0.1:99999 as port 34463, and print its own C-core lines for an empty address)."""
    problem = dial_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem}")
    return value


OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept() errors for want of a descriptor or memory: asyncio stops listening for 1 s and tries again."""


class Listener(socket.socket):
    """A listening socket for asyncio: one failed accept() per wake while descriptors run out, not thousands.

    asyncio's accept loop (CPython before the fix of its issue gh-151615) goes on calling accept() after one
    failed for want of a descriptor, up to the server's backlog times per wake (uvicorn's: 2048), each failure
    logged and scheduling a retry of its own in 1 s: while the daemon stays at its descriptor limit, the retries
    grow into tens of thousands a second and take the event loop that serves every request. After such a
    failure the next accept() says no connection waits (BlockingIOError), which ends that loop: one failure and
    one retry.
    """

    __slots__ = ("_short",)

    def __init__(self, family: int, kind: int) -> None:
        super().__init__(family, kind)
        self._short = False

    def accept(self) -> tuple[socket.socket, Any]:
        if self._short:
            self._short = False
            raise BlockingIOError(errno.EAGAIN, "no connection accepted until descriptors are free again")
        try:
            return super().accept()
        except OSError as error:
            self._short = error.errno in OUT_OF_RESOURCES
            raise
