"""What a local user (another one, or the same one by mistake) can do to a daemon's ports, sockets and dirs.

Issue 12 items 4-6: two daemons on one port, admin socket takeover and
deletion, runtime directory symlinks. Hostile files are planted by a second
unprivileged user where the test can create one (see tests/integration/users.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from stagevisor.supervisor import service
from stagevisor.supervisor.admin import endpoints
from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from stagevisor.supervisor.daemon.runtime_files import SocketClaim, make_private_dir
from tests.integration.daemon_helpers import DaemonProcess, colocated_pipeline
from tests.integration.users import SharedDir, as_other_user, other_user

DEAD_PID = 2**22 + 1  # above the kernel's pid_max ceiling: never a live process


class FakeGateway:
    def open(self, payload):
        raise AssertionError("no request is sent in these tests")


class FakeDaemon:
    """What start_servers needs of a daemon."""

    def __init__(self) -> None:
        self.gateway = FakeGateway()
        self.serving_listeners: list = []
        self.runners: dict = {}


@pytest.fixture
def sockets_dir():
    with tempfile.TemporaryDirectory(prefix="sv", dir="/tmp") as path:
        yield Path(path)


def run(coro):
    return asyncio.run(coro)


# -- item 4: a port in use is an error that names it ------------------------


def test_a_second_server_on_a_port_in_use_is_refused_naming_the_port():
    async def scenario():
        first, port = endpoints.create_server("127.0.0.1:0")
        await first.start()
        try:
            with pytest.raises(OSError, match=f"port {port} on 127.0.0.1 is already in use"):
                endpoints.create_server(f"127.0.0.1:{port}")
        finally:
            await first.stop(None)

    run(scenario())


def test_serving_on_a_port_in_use_fails_with_address_in_use(sockets_dir):
    async def scenario():
        first, port = endpoints.create_server("127.0.0.1:0")
        await first.start()
        try:
            with pytest.raises(DaemonError, match=f"127.0.0.1:{port} \\(--listen\\).*already in use") as raised:
                await service.start_servers(
                    FakeDaemon(), admin_address=f"unix:{sockets_dir / 'admin.sock'}", listen=f"127.0.0.1:{port}"
                )
            assert raised.value.code is DaemonErrorCode.ADDRESS_IN_USE
            # The admin socket claimed before the failure is given back.
            assert not (sockets_dir / "admin.sock").exists() and not (sockets_dir / "admin.sock.lock").exists()
        finally:
            await first.stop(None)

    run(scenario())


# -- item 5: admin socket takeover ------------------------------------------


def test_a_live_daemon_that_answers_slowly_is_not_taken_over(sockets_dir):
    """A daemon holds its socket's lock and accepts connections but never answers within 1 s (stopped, busy)."""
    path = sockets_dir / "admin.sock"
    claim = SocketClaim.acquire(path, "--admin-address")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(path))
    silent.listen(8)
    try:
        with pytest.raises(DaemonError, match="another stagevisor daemon") as raised:
            run(endpoints.ensure_no_live_daemon(f"unix:{path}"))
        assert raised.value.code is DaemonErrorCode.DAEMON_RUNNING
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        silent.close()
        claim.release()


def test_an_admin_address_naming_a_regular_file_never_deletes_it(sockets_dir):
    victim = sockets_dir / "notes.txt"
    victim.write_text("do not delete")
    with pytest.raises(DaemonError, match="regular file, not a socket") as raised:
        run(endpoints.ensure_no_live_daemon(f"unix://{victim}"))
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    with pytest.raises(DaemonError, match="regular file, not a socket"):
        run(
            service.start_servers(
                FakeDaemon(), admin_address=f"unix://{victim}", listen=f"unix:{sockets_dir / 'public.sock'}"
            )
        )
    assert victim.read_text() == "do not delete"


def test_on_exit_a_daemon_leaves_another_daemons_socket_at_its_path(sockets_dir):
    path = sockets_dir / "admin.sock"

    async def scenario():
        servers = await service.start_servers(
            FakeDaemon(), admin_address=f"unix:{path}", listen=f"unix:{sockets_dir / 'public.sock'}"
        )
        # Someone removed our socket and another daemon now listens there.
        path.unlink()
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(str(path))
        inode = os.lstat(path).st_ino
        try:
            await servers.stop(0)
            assert stat.S_ISSOCK(os.lstat(path).st_mode) and os.lstat(path).st_ino == inode
            assert not (sockets_dir / "public.sock").exists()  # our own public socket is removed
        finally:
            other.close()

    run(scenario())


def test_a_lock_file_planted_by_another_user_is_refused(sockets_dir):
    other_user()
    with SharedDir() as shared:
        as_other_user("install", "-m", "666", "/dev/null", str(shared / "admin.sock.lock"))
        with pytest.raises(DaemonError, match="not a regular file of this user") as raised:
            SocketClaim.acquire(shared / "admin.sock", "--admin-address")
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH


# -- item 6: runtime directory symlinks and ownership -----------------------


def test_a_runtime_dir_symlink_planted_by_another_user_is_refused_and_nothing_is_removed():
    """Steps: another user plants /tmp-like/stagevisor-<uid> -> a directory of ours holding `d<dead pid>`;
    the daemon is started with that runtime dir; it refuses, and the target keeps its mode and content."""
    other_user()
    with SharedDir() as shared, tempfile.TemporaryDirectory(prefix="sv-victim-", dir="/tmp") as victim:
        target = Path(victim)
        (target / f"d{DEAD_PID}").mkdir()
        (target / f"d{DEAD_PID}" / "data").write_text("keep me")
        target.chmod(0o755)
        link = shared / f"stagevisor-{os.getuid()}"
        as_other_user("ln", "-s", str(target), str(link))

        with DaemonProcess(colocated_pipeline(), env={"STAGEVISOR_RUNTIME_DIR": str(link)}) as daemon:
            assert daemon.wait_exit(timeout=60) == 1
            assert "symbolic link" in daemon.log()
        assert stat.S_IMODE(target.stat().st_mode) == 0o755
        assert (target / f"d{DEAD_PID}" / "data").read_text() == "keep me"


def test_a_runtime_dir_owned_by_another_user_is_refused():
    uid, _ = other_user()
    with SharedDir() as shared:
        as_other_user("mkdir", "-m", "777", str(shared / "rt"))
        with pytest.raises(DaemonError, match=f"belongs to uid {uid}") as raised:
            make_private_dir(shared / "rt")
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
        assert stat.S_IMODE((shared / "rt").stat().st_mode) == 0o777
