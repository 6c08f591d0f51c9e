"""A second, unprivileged local user for tests that play a hostile neighbour (planting links, files, dirs).

Root (as in CI) creates the user once with useradd; anyone else gets a skip
that says why. `as_other_user` runs a command (coreutils: ln, mkdir, install) as that user;
not Python, whose interpreter may live where that user cannot read.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pytest

OTHER_USER = "stagevisor-other"


def other_user() -> tuple[int, int]:
    """(uid, gid) of the second user; pytest.skip with the reason when it cannot exist here."""
    if not hasattr(os, "getuid"):
        pytest.skip("needs a POSIX system with users")
    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        if os.getuid() != 0:
            pytest.skip(
                f"needs a second local user {OTHER_USER!r}: run as root (it is then created with useradd) "
                "or create it yourself"
            )
        useradd = shutil.which("useradd")
        if useradd is None:
            pytest.skip("needs useradd to create a second local user")
        result = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True,
            text=True,
        )
        if result.returncode not in (0, 9):  # 9: created meanwhile by a parallel run
            pytest.skip(f"useradd {OTHER_USER} failed: {result.stderr.strip()}")
        entry = pwd.getpwnam(OTHER_USER)
    if entry.pw_uid == os.getuid():
        pytest.skip(f"the tests already run as {OTHER_USER}")
    if os.getuid() != 0:
        pytest.skip(f"acting as {OTHER_USER} needs root (to drop privileges in a subprocess)")
    return entry.pw_uid, entry.pw_gid


def as_other_user(*argv: str) -> None:
    """Run a command as the second user; fail the test when it fails."""
    uid, gid = other_user()
    result = subprocess.run(
        argv, user=uid, group=gid, extra_groups=[], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0, f"as {OTHER_USER}: {result.stderr}"


class SharedDir:
    """A world-writable sticky directory like /tmp (mode 1777), removed on exit."""

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="sv-shared-", dir="/tmp"))
        self.path.chmod(0o1777)
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def run_as_other_user(function: Callable[..., Any], *args: Any, timeout: float = 30.0) -> Any:
    """Call `function(*args)` in a forked child that has become the second user; return its (JSON) result.

    No exec: the child keeps this interpreter's modules, so it needs no Python the
    other user could read. An exception in the child comes back as AssertionError.
    """
    uid, gid = other_user()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop privileges, run, report, exit without running the parent's cleanups
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            result = {"ok": function(*args)}
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            result, status = {"error": f"{type(error).__name__}: {error}"}, 1
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        deadline = time.monotonic() + timeout
        chunks = []
        while True:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, 9)
                raise AssertionError(f"as {OTHER_USER}: {function.__name__} did not finish within {timeout}s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b"{}")
    if "error" in result or "ok" not in result:
        raise AssertionError(f"as {OTHER_USER}: {result.get('error', 'no result')}")
    return result["ok"]
