"""The daemon run by an unprivileged user: it serves, keeps its files to itself, and lets no other user in.

The second user of tests/integration/users.py runs `stagevisor serve` with this
interpreter (wrapped by `other_user_command`: pyenv's Python under /root is
closed to it), its admin API on an abstract socket (no file permissions: the
socket credentials decide) with a token. A third user plays the neighbour;
root plays the operator's own root CLI.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import ROOT, alive, daemon_env, descendants, poll_until
from tests.integration.users import THIRD_UID, SharedDir, other_user, other_user_command, run_as_other_user

pytestmark = pytest.mark.slow  # a daemon run by a second user, and users made for it

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # preface + empty SETTINGS
CONFIG = """\
pipeline:
  name: unprivileged
  stages:
    - name: entry
      factory: tests.integration.limit_stages:entry
      process: front
      next: [source]
    - name: source
      factory: tests.integration.limit_stages:source
      process: back
  process_safe_edges: [[entry, source]]
"""


def h2_answer(target: str) -> int:
    """Bytes the server at `target` (an abstract name with a leading NUL) answers to an HTTP/2 preface within
    5 s: 0 when it closes the connection unanswered (the admin gate refusing the caller)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(target)
            sock.sendall(PREFACE)
            return len(sock.recv(4096))
        except (ConnectionResetError, BrokenPipeError):
            return 0


def reach(path: str) -> str:
    """What connecting to the unix socket at `path` gives (runs as the third user)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError as error:
            return type(error).__name__
    return "connected"


class OtherUsersDaemon:
    """`stagevisor serve` as the second user, everything it needs in one shared (1777) directory of the test's."""

    def __init__(self, shared: Path) -> None:
        self.uid, self.gid = other_user()
        self.home = shared / "home"
        self.home.mkdir(mode=0o700)
        self.runtime = shared / f"stagevisor-{self.uid}"  # the daemon makes it, as under /tmp by default
        self.admin_address = f"unix-abstract:stagevisor-test-{os.getpid()}-{secrets.token_hex(4)}"
        self.listen = f"unix:{self.runtime / 'public.sock'}"
        self.token = self.home / "admin.key"
        self.token.write_text(secrets.token_urlsafe(24) + "\n")
        (self.home / "pipeline.yaml").write_text(CONFIG)
        for path in (self.home, self.token, self.home / "pipeline.yaml"):
            os.chown(path, self.uid, self.gid)
        self.token.chmod(0o600)
        self.scratch = shared / "scratch"  # root's: the mount point the wrapper needs
        self.scratch.mkdir()
        self.log_path = shared / "daemon.log"  # opened by root: the daemon writes to the descriptor
        self.env = {
            **daemon_env(self.runtime),
            "HOME": str(self.home),
            "TMPDIR": str(self.home),
            "STAGEVISOR_CACHE_DIR": str(self.home / "cache"),
        }
        self.proc: subprocess.Popen | None = None

    def command(self, *argv: str) -> list[str]:
        return other_user_command([sys.executable, *argv], self.scratch)

    def start(self) -> None:
        argv = self.command(
            "-m", "stagevisor", "serve", "--config", str(self.home / "pipeline.yaml"), "--http", "none",
            "--listen", self.listen, "--admin-address", self.admin_address,
            "--admin-api-key-file", str(self.token), "--stop-timeout", "5",
        )  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cli(self, *args: str, as_owner: bool = True) -> subprocess.CompletedProcess:
        """`stagevisor ARGS` against this daemon, run by its user (or by root), with the token."""
        argv = ["-m", "stagevisor", *args, "--admin-address", self.admin_address, "--api-key-file", str(self.token)]
        command = self.command(*argv) if as_owner else [sys.executable, *argv]
        return subprocess.run(command, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120)

    def serving(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, f"daemon exited:\n{self.log()}"
        result = self.cli("status", "--format", "json")
        return result.returncode == 0 and json.loads(result.stdout)["state"] == "SERVING"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        seen = descendants(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def daemon():
    other_user()
    with SharedDir() as shared:
        started = OtherUsersDaemon(shared)
        try:
            started.start()
            poll_until(started.serving, timeout=300, interval=1.0, message="the second user's daemon SERVING")
            yield started
        finally:
            started.stop()
            shutil.rmtree(shared / "home", ignore_errors=True)  # the user's files: root removes them


def synthesize(address: str) -> int:
    """Audio chunks of one request on the public endpoint (root, as a local client of the daemon's socket)."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        request = synthesis_pb2.SynthesizeRequest(text="As another user.", options={"seconds": "2"})
        return sum(1 for chunk in stub.Synthesize(request, timeout=60) if chunk.pcm)


def test_the_daemon_of_an_unprivileged_user_serves_requests(daemon):
    assert synthesize(daemon.listen) == 2
    workers = [pid for pid in descendants(daemon.proc.pid) if Path(f"/proc/{pid}/comm").read_text().startswith("sv:")]
    assert workers and {os.stat(f"/proc/{pid}").st_uid for pid in [daemon.proc.pid, *workers]} == {daemon.uid}


def test_its_runtime_files_are_its_own_and_closed_to_everyone_else(daemon):
    """The runtime directory it made is 0700 and its, like everything in it, which no one else may write to;
    its shared-memory area too; a third user cannot even reach its sockets."""
    info = daemon.runtime.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (daemon.uid, 0o700)
    entries = list(daemon.runtime.rglob("*"))
    assert any(e.is_socket() for e in entries), entries
    # Group or others may write nothing (a socket needs write permission to connect), enter no directory.
    loose = {
        str(e): oct(stat.S_IMODE(e.lstat().st_mode))
        for e in entries
        if e.lstat().st_mode & 0o022 or (e.is_dir() and e.lstat().st_mode & 0o077)
    }
    foreign = {str(e): e.lstat().st_uid for e in entries if e.lstat().st_uid != daemon.uid}
    assert not loose and not foreign, (loose, foreign)
    print(
        "\nruntime files:", {str(e.relative_to(daemon.runtime)): oct(stat.S_IMODE(e.lstat().st_mode)) for e in entries}
    )
    areas = list(Path("/dev/shm").glob(f"stagevisor-{daemon.uid}-{daemon.proc.pid}-*"))
    assert len(areas) == 1 or "SHM_FALLBACK" in daemon.log(), areas  # no area where /dev/shm is too small
    for area in areas:
        assert (area.stat().st_uid, stat.S_IMODE(area.stat().st_mode)) == (daemon.uid, 0o700)
    public = daemon.listen.removeprefix("unix:")
    assert run_as_other_user(reach, public, user=(THIRD_UID, THIRD_UID)) == "PermissionError"


def test_another_user_is_refused_on_its_admin_address_and_roots_cli_does_not_dial_it(daemon):
    """Steps: a third user speaks HTTP/2 to the abstract admin socket: closed unanswered, and the daemon logs
    it; the daemon's own user (its CLI, with the token) gets answers; root's CLI refuses to send the token to a
    socket another user's process listens on, before a byte goes out."""
    target = "\0" + daemon.admin_address.removeprefix("unix-abstract:")
    assert run_as_other_user(h2_answer, target, user=(THIRD_UID, THIRD_UID)) == 0
    poll_until(
        lambda: f"refused a connection from uid {THIRD_UID}" in daemon.log(),
        timeout=30,
        message="the refusal in the daemon's log",
    )
    assert run_as_other_user(h2_answer, target) > 0  # the daemon's own user
    status = daemon.cli("status", "--format", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "SERVING", status.stderr
    from_root = daemon.cli("status", as_owner=False)
    assert from_root.returncode != 0
    assert f"runs as uid {daemon.uid}, not as you (uid 0)" in from_root.stderr, from_root.stderr


def test_its_own_cli_stops_it_and_it_leaves_nothing_behind(daemon):
    """Last in the module: `stagevisor stop` by its user; the daemon exits 0, its workers are gone, and its
    sockets and shared-memory area with them."""
    pid = daemon.proc.pid
    workers = descendants(pid)
    stopped = daemon.cli("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert daemon.proc.wait(timeout=60) == 0, daemon.log()
    poll_until(lambda: not any(alive(p) for p in workers), timeout=30, message="every worker gone")
    assert not list(Path("/dev/shm").glob(f"stagevisor-{daemon.uid}-{pid}-*"))
    assert not [e for e in daemon.runtime.rglob("*") if e.is_socket()]
