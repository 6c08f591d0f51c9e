"""The daemon's files on the local host: private runtime directories and the unix sockets it binds.

These paths may sit in a directory every user can write (the default runtime
directory is /tmp/stagevisor-<uid>), so nothing here follows a symbolic link,
adopts a directory or file another user owns, or removes anything this process
did not create. Leaf module: stdlib plus errors and pids only.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import shutil
import stat
from pathlib import Path

from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from stagevisor.supervisor.numbers import whole_number
from stagevisor.supervisor.pids import pid_alive

log = logging.getLogger("stagevisor.daemon")

LOCK_SUFFIX = ".lock"


def _unsafe(message: str) -> DaemonError:
    return DaemonError(message, code=DaemonErrorCode.UNSAFE_PATH)


def _space_remedy(error: OSError) -> str:
    """The start of the remedy for a write that failed with `error`: free space where the disk or quota is full."""
    return "free space on its file system or " if error.errno in (errno.ENOSPC, errno.EDQUOT) else ""


def make_private_dir(
    path: Path, role: str = "runtime directory", remedy: str = "set STAGEVISOR_RUNTIME_DIR to a directory you own"
) -> None:
    """Create `path` (mode 0700) or tighten it; refuse a symlink, a non-directory or another user's directory.

    `role` names the directory in the error (DaemonError UNSAFE_PATH) and `remedy` tells the operator what to do.

    Checked on a descriptor opened with O_NOFOLLOW, so a link planted between
    the check and the chmod is refused too, never followed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(path) else "not a directory"
            raise _unsafe(
                f"{role} {path} is {kind}; refusing to use it (another user may have planted it): "
                f"remove it, or {remedy}"
            ) from None
        raise _unsafe(f"{role} {path} cannot be opened: {error.strerror}; {remedy}") from None
    try:
        refused = not_private_dir(path, os.fstat(fd), role)
        if refused:
            raise _unsafe(f"{refused}; {remedy}")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def not_private_dir(path: Path, info: os.stat_result, role: str) -> str | None:
    """Why `path`, whose lstat (or fstat) is `info`, is no directory of this user's, naming it by `role`: a symbolic
    link, not a directory, or another user's; None when it is one. The one test of it, whether the path was
    looked at by name (lstat) or through a descriptor opened without following links (fstat)."""
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
        return f"{role} {path} is {kind}"
    if info.st_uid != os.getuid():
        return f"{role} {path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()})"
    return None


def remove_private_tree(path: Path) -> bool:
    """Remove a directory this user owns and everything in it; never through a symbolic link.

    A symlink, a non-directory or another user's directory is left alone
    (logged). Inside, shutil.rmtree works on descriptors and unlinks links
    rather than following them. Returns True when the tree is gone.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        log.warning("not removing %s: it is a symbolic link, not a directory, or not this user's", path)
        return False

    def report(function, failed_path, exc_info) -> None:
        log.warning("could not remove %s: %s", failed_path, exc_info[1])

    shutil.rmtree(path, onerror=report)
    return not os.path.lexists(path)


def remove_stale_run_dirs(parent: Path) -> list[Path]:
    """Remove `d<pid>` worker-socket directories of daemons that are gone (killed with SIGKILL).

    Only real directories this user owns are candidates: a link named
    `d123` is not followed, another user's directory is not touched.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        pid = whole_number(entry.name[1:]) if entry.name.startswith("d") else None
        if pid is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except FileNotFoundError:
            continue
        if not pid_alive(pid) and remove_private_tree(Path(entry.path)):
            removed.append(Path(entry.path))
    return removed


def claim_holder(path: Path) -> int | None:
    """The pid written in the lock file of unix socket `path` (see SocketClaim) while that process runs, else None.

    For a client that gets no answer there: a daemon that holds the path but does not answer is starting,
    wedged or stopped, not gone. Only read, never locked: a daemon taking the lock meanwhile must not fail.
    """
    lock_path = Path(path).with_name(Path(path).name + LOCK_SUFFIX)
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        pid = whole_number(os.pread(fd, 32, 0).decode(errors="replace").strip())
    finally:
        os.close(fd)
    return pid if pid is not None and pid > 0 and pid_alive(pid) else None


class SocketClaim:
    """This process's hold on a unix socket path: an flock on `<path>.lock` beside it, kept until release().

    While one daemon holds the claim, no other can take the path over, however
    slowly the first answers. release() unlinks the socket only if it is still
    the very socket this process bound (same device and inode), never a file of
    another kind, then removes the lock file, and the directories acquire()
    created for the path where nothing else is in them.
    """

    def __init__(self, path: Path, option: str) -> None:
        self.path = Path(path)
        self.option = option
        self.lock_path = self.path.with_name(self.path.name + LOCK_SUFFIX)
        self.staging_path = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        """Where the server binds first: gRPC unlinks the path it bound when it stops, whatever is there by
        then, so it binds here and bound() renames the socket into place."""
        self._fd: int | None = None
        self._bound: tuple[int, int] | None = None
        self._created: list[Path] = []
        """The directories acquire() made for the path, deepest first: release() removes those left empty."""

    @classmethod
    def acquire(cls, path: Path, option: str) -> "SocketClaim":
        """Lock the path, making its missing directories (the last one private, 0700); DaemonError DAEMON_RUNNING
        when another process holds it, UNSAFE_PATH for a bad lock file, DAEMON_ERROR when a directory or the lock
        file cannot be written (a full file system)."""
        claim = cls(path, option)
        claim._created = list(itertools.takewhile(lambda directory: not directory.exists(), claim.path.parents))
        try:
            claim._make_directories()
            claim._lock()
        except BaseException:
            claim._remove_created()
            raise
        return claim

    def _remove_created(self) -> None:
        """Remove the directories acquire() made, deepest first, as far as each is empty (another daemon may have
        put its socket beside ours meanwhile)."""
        for directory in self._created:
            try:
                directory.rmdir()
            except FileNotFoundError:  # never made: acquire() failed above it
                continue
            except OSError:
                break
        self._created = []

    def _make_directories(self) -> None:
        if not self._created:
            return
        try:
            self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        except OSError as error:
            raise DaemonError(
                f"cannot make directory {self.path.parent} for {self.option} {self.path}: {error.strerror}; "
                f"{_space_remedy(error)}choose another {self.option}"
            ) from None

    def _lock(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        while True:
            try:
                fd = os.open(self.lock_path, flags, 0o600)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.EISDIR):  # something of the wrong kind is at the path
                    raise _unsafe(
                        f"cannot open lock file {self.lock_path} for {self.option} {self.path}: "
                        f"{'it is a symbolic link' if error.errno == errno.ELOOP else error.strerror}; "
                        f"remove it or choose another {self.option}"
                    ) from None
                # Not the path's fault (a full or read-only file system, a directory this user cannot write).
                raise DaemonError(
                    f"cannot create lock file {self.lock_path} for {self.option} {self.path}: {error.strerror}; "
                    f"{_space_remedy(error)}choose another {self.option}"
                ) from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                    raise _unsafe(
                        f"lock file {self.lock_path} is not a regular file of this user; "
                        f"remove it or choose another {self.option}"
                    )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                    raise DaemonError(
                        f"another stagevisor daemon (pid {holder}) holds {self.path} ({self.option}); "
                        f"stop it with `stagevisor stop` or choose another {self.option}",
                        code=DaemonErrorCode.DAEMON_RUNNING,
                    ) from None
                # The holder may have released and removed the file between our open and
                # flock; a lock on an unlinked file guards nothing, so start over.
                try:
                    current = os.lstat(self.lock_path)
                except FileNotFoundError:
                    os.close(fd)
                    continue
                if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
                    os.close(fd)
                    continue
                self._write_pid(fd)
                self._fd = fd
                return
            except BaseException:
                os.close(fd)
                raise

    def _write_pid(self, fd: int) -> None:
        """Write this process's id into the lock file just locked on `fd`. When it cannot (a full file system),
        remove the lock file, ours since we hold its lock and empty now, and raise DaemonError naming the file and
        the system's reason."""
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as error:
            self._unlink_lock_file(fd)
            raise DaemonError(
                f"cannot write lock file {self.lock_path} for {self.option} {self.path}: {error.strerror}; "
                f"{_space_remedy(error)}choose another {self.option}"
            ) from None

    def _unlink_lock_file(self, fd: int) -> None:
        """Remove the lock file locked on `fd` if it is still the file at the lock path (same inode)."""
        try:
            info, current = os.fstat(fd), os.lstat(self.lock_path)
            if (current.st_dev, current.st_ino) == (info.st_dev, info.st_ino):
                self.lock_path.unlink()
        except FileNotFoundError:
            pass

    def existing(self) -> str | None:
        """What is at the socket path now: None (nothing), "socket", or a description of something else."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return None
        if stat.S_ISSOCK(info.st_mode):
            return "socket"
        if stat.S_ISLNK(info.st_mode):
            return "a symbolic link"
        if stat.S_ISDIR(info.st_mode):
            return "a directory"
        if stat.S_ISREG(info.st_mode):
            return "a regular file"
        if stat.S_ISFIFO(info.st_mode):
            return "a FIFO"
        return "a device file" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "another kind of file"

    def refuse_non_socket(self) -> None:
        """DaemonError UNSAFE_PATH when something other than a socket sits at the path (it is never removed)."""
        kind = self.existing()
        if kind not in (None, "socket"):
            raise _unsafe(
                f"{self.path} ({self.option}) exists and is {kind}, not a socket; refusing to replace it: "
                f"choose another {self.option} or move that file away"
            )

    def remove_stale_socket(self) -> None:
        """Unlink a socket left at the path by a daemon that is gone (we hold the lock, so it is not live)."""
        assert self._fd is not None, "remove_stale_socket() needs the claim held"
        self.refuse_non_socket()
        if self.existing() == "socket":
            log.info("removing stale socket %s left by a daemon that is gone", self.path)
            self.path.unlink(missing_ok=True)

    def bound(self) -> None:
        """Move the socket just bound at `staging_path` to the path and remember it: release() removes that one only."""
        info = os.lstat(self.staging_path)
        if not stat.S_ISSOCK(info.st_mode):
            raise _unsafe(f"{self.staging_path} is not the socket this daemon bound; remove it and start again")
        try:
            os.rename(self.staging_path, self.path)
        except OSError as error:  # e.g. another user's file appeared there, in a sticky directory
            raise _unsafe(
                f"cannot put the socket in place at {self.path} ({self.option}): {error.strerror}; "
                f"choose another {self.option}"
            ) from None
        self._bound = (info.st_dev, info.st_ino)

    def release(self) -> None:
        """Unlink our own socket (same inode) and the lock file, then drop the lock. Idempotent."""
        if self._fd is not None:
            try:
                if stat.S_ISSOCK(os.lstat(self.staging_path).st_mode):  # bound, failed before bound()
                    self.staging_path.unlink()
            except FileNotFoundError:
                pass
        if self._bound is not None:
            try:
                info = os.lstat(self.path)
                if stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == self._bound:
                    self.path.unlink()
                else:
                    log.warning("not removing %s: it is no longer the socket this daemon created", self.path)
            except FileNotFoundError:
                pass
            self._bound = None
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Unlinked while still locked: whoever opened it meanwhile sees the inode
            # change after its flock and retries on a fresh file (see _lock).
            self._unlink_lock_file(fd)
        finally:
            os.close(fd)
        self._remove_created()
