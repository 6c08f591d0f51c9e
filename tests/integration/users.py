"""A second, unprivileged local user for tests that play a hostile neighbour (planting links, files, dirs), or
run a daemon of their own.

Root (as in CI) creates the user once with useradd; anyone else gets a skip
that says why. `as_other_user` runs a command (coreutils: ln, mkdir, install) as that user;
`run_as_other_user` calls a function in a forked child that became it; `other_user_command`
wraps a command of this interpreter (a daemon, the CLI) to run as it.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

OTHER_USER = "stagevisor-other"
THIRD_UID = 65534
"""A third user (`nobody` on most systems; setuid needs no passwd entry): a neighbour of the second user's daemon."""


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
            timeout=60,
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


def run_as_other_user(
    function: Callable[..., Any], *args: Any, timeout: float = 30.0, user: tuple[int, int] | None = None
) -> Any:
    """Call `function(*args)` in a forked child that has become the second user (or `user`, a (uid, gid)); return
    its (JSON) result.

    No exec: the child keeps this interpreter's modules, so it needs no Python the
    other user could read. An exception in the child comes back as AssertionError.
    """
    uid, gid = user if user is not None else other_user()
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


# -- this interpreter, run as the second user ---------------------------------------------------

# Runs in a private mount namespace (unshare -m; nothing here reaches the host's mounts): binds the
# interpreter's subtree aside, covers the closed directory with an empty tmpfs of mode 0711, binds the
# subtree back at its own path under it, then becomes the user.
_REOPEN = r"""
set -e
closed=$1 child=$2 aside=$3 uid=$4 gid=$5
shift 5
mount --bind "$closed/$child" "$aside"
mount -t tmpfs -o mode=0711,size=64k stagevisor-test "$closed"
mkdir "$closed/$child"
mount --move "$aside" "$closed/$child"
exec setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "$@"
"""


def _closed_to_others(path: Path) -> list[Path]:
    """The directories on the way to `path` (itself included when a directory) that others may not enter."""
    closed = []
    for directory in [*reversed(path.parents), path]:
        try:
            info = directory.stat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH:
            closed.append(directory)
    return closed


def other_user_command(argv: Sequence[str], scratch: Path) -> list[str]:
    """`argv` (a command of this interpreter: sys.executable first) wrapped to run as the second user.

    This interpreter may live where that user cannot go: pyenv's, here, under /root (mode 0700).
    Opening /root to everyone (or to that user, by an ACL) would change the host for a test's sake,
    and a copy of the interpreter would copy its gigabytes of site-packages. Instead, where one
    directory on the way is closed, the command runs in a private mount namespace in which an empty
    tmpfs of mode 0711 covers that directory and only the interpreter's own subtree is bound back at
    its own path: every path stays the same, nothing else of that directory is visible, and the
    host's directory is untouched. setpriv then drops to the user. Where the user can already run
    the interpreter, only setpriv. `scratch`: a directory of the test's (it gets an empty mount point).
    Skips, saying why, where neither works.
    """
    uid, gid = other_user()
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    needed = [Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix).resolve(), Path(__file__)]
    closed = sorted({d for path in needed for d in _closed_to_others(path)})
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run a command as the second user")
    if not closed:
        wrap: Callable[[Sequence[str]], list[str]] = lambda command: [*drop, *command]  # noqa: E731
    else:
        interpreter = Path(sys.base_prefix).resolve()
        if len(closed) > 1 or closed[0] not in interpreter.parents:
            pytest.skip(
                f"the second user cannot reach {', '.join(map(str, closed))}, not only one directory above this "
                f"interpreter ({interpreter}): install Python where other users can read it"
            )
        child = interpreter.relative_to(closed[0]).parts[0]
        if shutil.which("unshare") is None or shutil.which("mount") is None:
            pytest.skip(f"the second user cannot reach {closed[0]} (this interpreter's) and unshare/mount are missing")

        def wrap(command: Sequence[str]) -> list[str]:
            aside = Path(tempfile.mkdtemp(prefix="interpreter-", dir=scratch))
            return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _REOPEN, "sh", str(closed[0]),
                    child, str(aside), str(uid), str(gid), *command]  # fmt: skip

    if not _PROBED:  # once per session: a container may forbid mount namespaces (no CAP_SYS_ADMIN)
        probe = subprocess.run(
            wrap([sys.executable, "-c", "import stagevisor.supervisor"]),
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/",
        )
        _PROBED.append(probe.returncode == 0)
        _PROBED.append(probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit {probe.returncode}")
    if not _PROBED[0]:
        pytest.skip(f"cannot run this interpreter as {OTHER_USER}: {_PROBED[1]}")
    return wrap(argv)


_PROBED: list[Any] = []
"""[ran, why not]: whether `other_user_command` could run this interpreter as the second user (tried once)."""
