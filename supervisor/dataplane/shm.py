"""Shared-memory handoff of large buffers between processes on one host: one copy in, mapped out.

A daemon owns one private directory under /dev/shm (mode 0700, an
unpredictable name, created with mkdir so it cannot be pre-created by anyone
else), its `SharedArea`. Every sender (the gateway and each worker) keeps a
`SegmentPool` of reusable files in it, named `<writer pid>-<random>`. What
travels is a token naming one write into one file, `<file>.<n>` (n counts the
pool's writes); the receiver maps the file and sends a Release of that token
once the array built on it is gone, and the file is handed out again. A
Release of any other write of the file (a stale or repeated one) is ignored,
so it can never free the file under a later write's receiver. Receivers never
unlink: only a file's writer (or the daemon, for a writer that died) removes it.

A receiver opens nothing but a regular file of its own user, by a token of
the exact form above, relative to the area's directory, without following links.

Plain files and mmap, not multiprocessing.shared_memory: the latter registers
segments with a resource-tracker process that unlinks and warns on exit.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagevisor.supervisor import envs
from stagevisor.supervisor.numbers import whole_number
from stagevisor.supervisor.pids import pid_alive

log = logging.getLogger(__name__)

SHM_ROOT = Path("/dev/shm")
SHM_DIR_ENV = envs.SHM_DIR.name
"""Where daemons create their shared-memory directory (default /dev/shm): a tmpfs, ideally."""
SHM_BYTES_PER_REQUEST_ENV = envs.SHM_BYTES_PER_REQUEST.name
DEFAULT_BYTES_PER_REQUEST = 16 * 1024 * 1024
"""Shared memory one in-flight request is assumed to need (a 16 MiB tensor handoff)."""
DEFAULT_CONCURRENT_REQUESTS = 8
"""Requests assumed in flight at once when the daemon is given no admission limit."""

POOL_PEAK_SECONDS = 30.0
"""How long a sender's pool keeps the files of its busiest moment (see SegmentPool)."""

_AREA_NAME = re.compile(r"^stagevisor-(\d+)-(\d+)-[0-9a-f]{16}\Z")  # \Z: `$` would also match before a final newline
_SEGMENT_NAME = re.compile(r"^(\d{1,10})-[0-9a-f]{16}\Z")
_SEGMENT_TOKEN = re.compile(r"^([0-9]{1,10}-[0-9a-f]{16})\.[0-9]{1,19}\Z")
"""One write into a pooled file: `<file>.<write number>`, what a SharedBuffer names and a Release gives back."""


class SharedMemoryError(OSError):
    """A shared buffer cannot be created or opened; the message names the file and the reason."""


def shm_root() -> Path:
    return Path(envs.SHM_DIR.get() or SHM_ROOT)


def bytes_per_request() -> int:
    raw = envs.SHM_BYTES_PER_REQUEST.get()
    size = whole_number(raw)
    return DEFAULT_BYTES_PER_REQUEST if size is None else size


def free_bytes(root: Path) -> int:
    """Bytes an unprivileged writer can still allocate under `root`."""
    info = os.statvfs(root)
    return info.f_bavail * info.f_frsize


def new_area_path(root: Path | None = None) -> Path:
    """A fresh, unguessable directory name for this daemon's area (nothing is created)."""
    root = root if root is not None else shm_root()
    return root / f"stagevisor-{os.getuid()}-{os.getpid()}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Room:
    """What the start-up check found: whether the area fits, and the figures behind it."""

    ok: bool
    root: Path
    free: int
    needed: int
    reason: str = ""
    writable: bool = True
    """False when `root` cannot be written to at all: more room would not help, fixing the directory would."""


def check_room(root: Path, needed: int) -> Room:
    """Whether `root` exists, is writable and has `needed` bytes free."""
    try:
        if not root.is_dir() or not os.access(root, os.W_OK | os.X_OK):
            return Room(False, root, 0, needed, f"{root} is not a writable directory", writable=False)
        free = free_bytes(root)
    except OSError as error:
        return Room(False, root, 0, needed, f"{root} cannot be inspected: {error.strerror}", writable=False)
    if free < needed:
        return Room(False, root, free, needed, f"{root} has {mib(free)} free, the pool needs {mib(needed)}")
    return Room(True, root, free, needed)


def mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


class SharedArea:
    """A daemon's private shared-memory directory, opened once; files are reached relative to it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def create(cls, path: Path) -> "SharedArea":
        """Make the directory (0700; fails if anything exists at `path`) and open it."""
        os.mkdir(path, 0o700)
        return cls.open(path)

    @classmethod
    def open(cls, path: Path) -> "SharedArea":
        """Open an existing area; refuse a symlink, a non-directory, or one not private to this user."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise SharedMemoryError(
                error.errno, f"cannot open the shared-memory directory: {error.strerror}", str(path)
            ) from None
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            os.close(fd)
            raise SharedMemoryError(
                errno.EPERM,
                "shared-memory directory is not private to this user "
                f"(owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o})",
                str(path),
            )
        return cls(path, fd)

    # ---- writing ------------------------------------------------------------------

    def allocate(self, size: int) -> tuple[str, mmap.mmap | None]:
        """A new file of `size` bytes with its pages reserved, and a writable shared mapping of it.

        The pages are reserved with fallocate, so a full tmpfs is an OSError
        (ENOSPC) here instead of a SIGBUS when the mapping is written.
        """
        name = f"{os.getpid()}-{secrets.token_hex(8)}"
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._fd)
        try:
            if size:
                os.posix_fallocate(fd, 0, size)
            mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) if size else None
        except BaseException:
            os.close(fd)
            self.unlink(name)
            raise
        os.close(fd)
        return name, mapped

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except FileNotFoundError:
            pass

    # ---- reading ------------------------------------------------------------------

    def map(self, token: str, size: int) -> mmap.mmap:
        """Map the file of a write a peer made (a SegmentPool token), privately (the receiver's writes stay its own).

        Refuses tokens not of the form `<pid>-<16 hex>.<n>`, anything but a
        regular file of this user (symlinks, FIFOs, directories, devices), and
        a file smaller than `size`.
        """
        match = _SEGMENT_TOKEN.match(token)
        if match is None:
            raise SharedMemoryError(errno.EINVAL, f"refusing shared buffer name {token[:80]!r}")
        name = match.group(1)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._fd)
        except OSError as error:
            raise SharedMemoryError(error.errno, f"cannot open shared buffer: {error.strerror}", name) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise SharedMemoryError(errno.EPERM, "shared buffer is not a regular file of this user", name)
            if info.st_size < size:
                raise SharedMemoryError(errno.EINVAL, f"shared buffer holds {info.st_size} bytes, not {size}", name)
            return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)

    # ---- cleaning up --------------------------------------------------------------

    def files(self) -> list[str]:
        return os.listdir(self._fd)

    def sweep_dead_writers(self) -> int:
        """Unlink the files of writers that are gone (a killed worker's pool); return how many."""
        removed = 0
        for name in self.files():
            match = _SEGMENT_NAME.match(name)
            if match is None or int(match.group(1)) == os.getpid():
                continue
            if not pid_alive(int(match.group(1))):
                self.unlink(name)
                removed += 1
        return removed

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def remove(self) -> None:
        """Remove the directory and everything in it (never through a link); close it."""
        self.close()
        remove_area(self.path)


def file_of(token: str) -> str:
    """The file a SegmentPool token's write went into (the token without its write number)."""
    return token.rpartition(".")[0]


def remove_area(path: Path) -> None:
    """Remove an area directory of this user and everything in it, never through a link; nothing if it is gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return
    # rmtree walks by file descriptor on Linux and never follows a symlink inside.
    shutil.rmtree(path, onerror=lambda *args: log.debug("cannot remove %s", args[1], exc_info=args[2]))


def remove_orphan_areas(root: Path | None = None, *, daemon: int | None = None) -> int:
    """Remove this user's areas whose daemon is gone (it was killed with SIGKILL); return how many.

    `daemon`: only the areas of the daemon that had that pid (one its parent reaped: `stagevisor bench`'s).
    Skips anything that is not a directory of this user; never raises.
    """
    root = root if root is not None else shm_root()
    removed = 0
    try:
        entries = list(os.scandir(root))
    except OSError:
        return 0
    for entry in entries:
        match = _AREA_NAME.match(entry.name)
        if match is None or int(match.group(1)) != os.getuid() or int(match.group(2)) == os.getpid():
            continue
        if daemon is not None and int(match.group(2)) != daemon:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            if pid_alive(int(match.group(2))):
                continue
            remove_area(Path(entry.path))
            removed += 1
        except OSError:
            log.debug("cannot sweep %s", entry.path, exc_info=True)
    return removed


class SegmentPool:
    """A sender's reusable shared files, so a large handoff costs one plain copy.

    Writing into a fresh tmpfs file makes the kernel allocate and zero every
    page first, and unmapping and unlinking it frees them again; measured here
    that more than doubles the cost of the copy itself. A pooled file is
    overwritten in place instead. The receiver maps it and sends a Release
    once the array built on it is garbage collected; only then is the file
    handed out again. A file whose receiver can no longer release it (its link
    broke) is dropped: unlinked and unmapped.

    Each write is named by its own token (`file_of` gives its file), and only
    the token of a file's current write releases or drops it: a Release that
    comes twice, or late, after the file went out again for another request,
    is counted in `ignored` and changes nothing, instead of freeing the file
    while that request's receiver still reads it.

    How many free files stay: at least `max_free`, and beyond that as many as
    keep the pool (busy and free together) within the most bytes it had busy
    at once in the last `peak_seconds`. So a sender with many large tensors in
    flight (64 x 16 MiB) reuses every file instead of re-creating most of them
    on each burst, the pool never holds more shared memory than its own
    in-flight handoffs recently needed, and it shrinks back to `max_free`
    files once a burst is `peak_seconds` past (checked whenever it is used).
    When the least recently released file has to go, it goes first.
    """

    def __init__(
        self, area: SharedArea, max_free: int = 8, peak_seconds: float = POOL_PEAK_SECONDS, clock: Any = time.monotonic
    ) -> None:
        self.area = area
        self.max_free = max_free
        self.peak_seconds = peak_seconds
        self._clock = clock
        self._free: list[tuple[str, mmap.mmap | None, int]] = []  # (name, writable mapping, capacity), LRU first
        self._busy: dict[str, tuple[str, mmap.mmap | None, int]] = {}  # by the token of the write that holds it
        self._writes = itertools.count(1)
        self._busy_bytes = 0
        self._free_bytes = 0
        self._peak = 0
        self._peak_at = clock()
        self.created = 0
        """Files created so far; steady state creates none."""
        self.ignored = 0
        """Releases and drops that named no write in flight (repeated, or stale: the file went out again since)."""

    def write(self, buffer: memoryview) -> str:
        """Copy `buffer` into a free file (or a new one) and return this write's token; OSError when no file can
        be made. The token, not the file, is what the receiver maps and releases."""
        view = memoryview(buffer).cast("B")
        size = view.nbytes
        segment = self._take_free(size)
        if segment is None:
            try:
                name, mapped = self.area.allocate(size)
            except OSError:
                if not self._free:
                    raise
                # A full tmpfs: free files of other sizes make room for this one (once).
                self._trim(keep=0)
                name, mapped = self.area.allocate(size)
            segment = (name, mapped, size)
            self.created += 1
        name, mapped, capacity = segment
        if size:
            assert mapped is not None, "a segment of a nonzero size is mapped"
            # A plain memcpy into pages that already exist and are mapped.
            mapped[:size] = view
        token = f"{name}.{next(self._writes)}"
        self._busy[token] = segment
        self._busy_bytes += capacity
        now = self._clock()
        if self._busy_bytes >= self._peak or now - self._peak_at > self.peak_seconds:
            self._peak, self._peak_at = self._busy_bytes, now
        self._trim()
        return token

    def release(self, token: str) -> None:
        """The receiver is done with the write `token` names: its file may be overwritten."""
        segment = self._busy.pop(token, None)
        if segment is None:
            self._ignore("release", token)
            return
        self._busy_bytes -= segment[2]
        if self.max_free <= 0 and self.peak_seconds <= 0:
            self._drop(segment)
            return
        self._free.append(segment)
        self._free_bytes += segment[2]
        if self._clock() - self._peak_at > self.peak_seconds:
            self._peak, self._peak_at = self._busy_bytes, self._clock()
        self._trim()

    def drop(self, token: str) -> None:
        """Nobody will release the write `token` names (its receiver is gone): remove its file, never reuse it."""
        segment = self._busy.pop(token, None)
        if segment is None:
            self._ignore("drop", token)
            return
        self._busy_bytes -= segment[2]
        self._drop(segment)

    def _ignore(self, what: str, token: str) -> None:
        self.ignored += 1
        log.debug("ignoring a %s of shared buffer %s: no such write in flight (repeated or stale)", what, token[:80])

    def expire(self) -> None:
        """Once the busiest moment is `peak_seconds` past, drop free files beyond `max_free` without waiting
        for the next use: a sender idle since a burst would otherwise keep the burst's files."""
        now = self._clock()
        if now - self._peak_at > self.peak_seconds:
            self._peak, self._peak_at = self._busy_bytes, now
            self._trim()

    def surplus_expires_in(self) -> float | None:
        """Seconds until `expire` may drop free files kept beyond `max_free` for a recent peak; None: none kept."""
        if len(self._free) <= self.max_free:
            return None
        return max(0.0, self._peak_at + self.peak_seconds - self._clock())

    def busy(self) -> int:
        return len(self._busy)

    def files(self) -> int:
        return len(self._busy) + len(self._free)

    def held_bytes(self) -> int:
        """Capacity of every file this pool holds, busy or free."""
        return self._busy_bytes + self._free_bytes

    def close(self) -> None:
        for segment in [*self._free, *self._busy.values()]:
            self._drop(segment)
        self._free.clear()
        self._busy.clear()
        self._busy_bytes = self._free_bytes = 0

    def _trim(self, keep: int | None = None) -> None:
        """Drop free files, least recently released first, beyond `max_free` and the recent peak."""
        keep = self.max_free if keep is None else keep
        while len(self._free) > keep and (keep == 0 or self._busy_bytes + self._free_bytes > self._peak):
            segment = self._free.pop(0)
            self._free_bytes -= segment[2]
            self._drop(segment)

    def _take_free(self, size: int) -> tuple[str, mmap.mmap | None, int] | None:
        # The smallest free file that fits, if it is not wastefully large.
        best = None
        for segment in self._free:
            if size <= segment[2] <= 2 * size and (best is None or segment[2] < best[2]):
                best = segment
        if best is None:
            return None
        self._free.remove(best)
        self._free_bytes -= best[2]
        return best

    def _drop(self, segment: tuple[str, mmap.mmap | None, int]) -> None:
        name, mapped, _ = segment
        if mapped is not None:
            mapped.close()
        try:
            self.area.unlink(name)
        except OSError:
            log.debug("cannot unlink shared buffer %s", name, exc_info=True)
