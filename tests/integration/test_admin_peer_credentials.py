"""Admin access decided by who the caller is: SO_PEERCRED on every unix admin address, and a CLI that checks
where it dials before it sends a byte (or a token).

A second, unprivileged user plays the neighbour (tests/integration/users.py: created with useradd when the
tests run as root, as in CI; skipped with the reason elsewhere). It runs in a forked child that dropped
privileges, speaking raw bytes: an HTTP/2 preface and a SETTINGS frame, which a gRPC server answers with its
own SETTINGS, and a refused connection answers with nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from stagevisor.supervisor import service
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.security.server import Security
from tests.integration.daemon_helpers import ROOT, child_env, poll_until
from tests.integration.users import SharedDir, other_user, run_as_other_user

TOKEN = secrets.token_urlsafe(24)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # preface + empty SETTINGS


class FakeDaemon:
    """What start_servers needs of a daemon (no request reaches it here)."""

    def __init__(self) -> None:
        self.gateway = object()
        self.serving_listeners: list = []


def h2_answer(target: str) -> int:
    """Bytes the server at `target` (a path, or an abstract name with a leading NUL) answers to an HTTP/2
    preface within 5 s: 0 when it closes the connection unanswered. Runs in the other user's child too."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(target)
            sock.sendall(PREFACE)
            return len(sock.recv(4096))
        except (ConnectionResetError, BrokenPipeError):
            return 0


def abstract_address() -> tuple[str, str]:
    name = f"stagevisor-test-{os.getpid()}-{secrets.token_hex(4)}"
    return f"unix-abstract:{name}", "\0" + name


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def sockets_dir():
    with tempfile.TemporaryDirectory(prefix="sv", dir="/tmp") as path:
        yield Path(path)


# -- A: the daemon side ---------------------------------------------------------------


def test_another_user_is_refused_on_an_abstract_admin_address_while_its_owner_gets_answers(sockets_dir):
    """Steps: a daemon's admin API on an abstract socket (with its token); the second user connects and
    speaks HTTP/2: the connection is closed unanswered and logged; this user gets the gRPC server's SETTINGS."""
    other_uid, _ = other_user()
    address, target = abstract_address()

    async def scenario():
        servers = await service.start_servers(
            FakeDaemon(),
            admin_address=address,
            listen=f"unix:{sockets_dir / 'public.sock'}",
            admin_security=Security(api_key=TOKEN),
        )
        try:
            assert await asyncio.to_thread(run_as_other_user, h2_answer, target) == 0
            assert servers.gate is not None and servers.gate.refused == 1
            assert await asyncio.to_thread(h2_answer, target) > 0
        finally:
            await servers.stop(0)

    with LogLines("stagevisor.admin") as lines:
        run(scenario())
    assert any(f"refused a connection from uid {other_uid}" in line for line in lines)


def test_admin_allow_uid_lets_that_user_in(sockets_dir):
    other_uid, _ = other_user()
    address, target = abstract_address()

    async def scenario():
        servers = await service.start_servers(
            FakeDaemon(),
            admin_address=address,
            listen=f"unix:{sockets_dir / 'public.sock'}",
            admin_security=Security(api_key=TOKEN),
            admin_allowed_uids=frozenset({os.getuid(), 0, other_uid}),
        )
        try:
            assert await asyncio.to_thread(run_as_other_user, h2_answer, target) > 0
        finally:
            await servers.stop(0)

    run(scenario())


def test_a_path_admin_socket_open_to_some_users_still_refuses_the_others_by_credentials():
    """The socket is 0666 once the operator allows another uid; a user not among them is refused by the gate."""
    other_user()
    with SharedDir() as shared:
        path = shared / "admin.sock"

        async def scenario():
            servers = await service.start_servers(
                FakeDaemon(),
                admin_address=f"unix:{path}",
                listen=f"unix:{shared / 'public.sock'}",
                admin_allowed_uids=frozenset({os.getuid(), 0, 4_000_000}),  # some uid, not the second user's
            )
            try:
                assert path.stat().st_mode & 0o777 == 0o666
                assert await asyncio.to_thread(run_as_other_user, h2_answer, str(path)) == 0
                assert await asyncio.to_thread(h2_answer, str(path)) > 0
            finally:
                await servers.stop(0)

        run(scenario())
        assert not path.exists()


def test_an_abstract_admin_address_without_a_token_is_refused(sockets_dir):
    address, _ = abstract_address()
    with pytest.raises(DaemonError, match="abstract unix socket, which has no file permissions"):
        run(service.start_servers(FakeDaemon(), admin_address=address, listen=f"unix:{sockets_dir / 'p.sock'}"))


def test_the_log_names_the_abstract_admin_address(sockets_dir):
    address, _ = abstract_address()

    async def scenario():
        servers = await service.start_servers(
            FakeDaemon(),
            admin_address=address,
            listen=f"unix:{sockets_dir / 'public.sock'}",
            admin_security=Security(api_key=TOKEN),
        )
        await servers.stop(0)

    with LogLines("stagevisor.daemon") as lines:
        run(scenario())
    assert any(line.startswith(f"admin API listening on {address} (") for line in lines), lines


# -- B: the CLI side -------------------------------------------------------------------


def cli(*args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    env = child_env({**os.environ, "STAGEVISOR_API_KEY": token})
    return subprocess.run(
        [sys.executable, "-m", "stagevisor", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


class Listener:
    """A listening unix socket that records whether anyone connected and what they sent."""

    def __init__(self, target: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(target)
        self.sock.listen(8)
        self.sock.settimeout(0.2)

    def received(self) -> bytes:
        data = b""
        while True:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                return data
            with conn:
                conn.settimeout(0.5)
                try:
                    while chunk := conn.recv(4096):
                        data += chunk
                except (TimeoutError, socket.timeout):
                    pass

    def close(self) -> None:
        self.sock.close()


def test_the_cli_refuses_a_runtime_directory_another_user_planted_and_sends_nothing():
    """Steps: a mode-777 directory of the second user holding a listening `admin.sock` of theirs; `stagevisor
    status` with a token pointed there exits 2 naming the directory's owner; the listener got no connection."""
    uid, gid = other_user()
    with SharedDir() as shared:
        planted = shared / "stagevisor"
        planted.mkdir()
        listener = Listener(str(planted / "admin.sock"))
        try:
            os.chown(planted, uid, gid)
            planted.chmod(0o777)
            os.lchown(planted / "admin.sock", uid, gid)
            result = cli("status", "--admin-address", f"unix:{planted / 'admin.sock'}")
            assert result.returncode == 2, result
            assert f"belongs to uid {uid}" in result.stderr and "not dialing" in result.stderr
            assert listener.received() == b""
        finally:
            listener.close()


@pytest.mark.parametrize(
    "setup,why",
    [
        ("world-writable", "is writable by other users (mode 0777)"),
        ("symlink", "is a symbolic link"),
    ],
)
def test_the_cli_refuses_an_unsafe_directory_of_its_own_user(setup, why):
    with tempfile.TemporaryDirectory(prefix="sv", dir="/tmp") as base:
        real = Path(base) / "real"
        real.mkdir()
        listener = Listener(str(real / "admin.sock"))
        try:
            if setup == "world-writable":
                real.chmod(0o777)
                address = f"unix:{real / 'admin.sock'}"
            else:
                (Path(base) / "link").symlink_to(real)
                address = f"unix:{Path(base) / 'link' / 'admin.sock'}"
            result = cli("status", "--admin-address", address)
            assert result.returncode == 2 and why in result.stderr, result
            assert listener.received() == b""
        finally:
            listener.close()


def _listen_abstract_once(target: str) -> int:
    """As the other user: listen on an abstract name, accept one connection, return the bytes it sent."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(target)
        sock.listen(1)
        sock.settimeout(30)
        conn, _ = sock.accept()
        with conn:
            conn.settimeout(2)
            data = b""
            try:
                while chunk := conn.recv(4096):
                    data += chunk
            except (TimeoutError, socket.timeout):
                pass
            return len(data)


def test_the_cli_refuses_an_abstract_admin_address_held_by_another_user():
    other_uid, _ = other_user()
    address, target = abstract_address()
    received: list[int] = []
    thread = threading.Thread(target=lambda: received.append(run_as_other_user(_listen_abstract_once, target)))
    thread.start()
    try:
        poll_until(
            lambda: "@" + target[1:] in Path("/proc/net/unix").read_text(), timeout=30, message="the planted name"
        )
        result = cli("status", "--admin-address", address)
        assert result.returncode == 2, result
        assert f"runs as uid {other_uid}" in result.stderr
    finally:
        if not received and thread.is_alive():  # the CLI never connected: release the child's accept
            try:
                h2_answer(target)
            except OSError:
                pass
        thread.join(60)
    assert received == [0]  # the CLI's probe connected and sent nothing; the token never left


class LogLines(logging.Handler):
    """The formatted messages of one logger while the context is open."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.logger = logging.getLogger(name)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.logger.addHandler(self)
        self.previous = self.logger.level
        self.logger.setLevel(logging.DEBUG)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.previous)
