"""Shared-memory handoff of large buffers between workers on one host: one copy in, mapped out.

A buffer too large for a gRPC message is written once into a plain file under
/dev/shm and only its name travels. The receiver maps the file and unlinks it
at once, so the memory is freed when the last array viewing the mapping is
garbage collected. Names carry a per-daemon prefix so the gateway can remove
what a crashed worker left behind (`remove_leftovers`).

Plain files and mmap, not multiprocessing.shared_memory: the latter registers
segments with a resource-tracker process that unlinks and warns on exit.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
from pathlib import Path

from stagevisor.supervisor.pids import pid_alive

SHM_DIR = Path("/dev/shm")

_counter = itertools.count()


def prefix_for(sink_address: str) -> str:
    """The per-daemon name prefix, derived from the daemon's sink address every worker knows."""
    digest = hashlib.sha1(sink_address.encode()).hexdigest()[:12]
    return f"stagevisor-{digest}"


def available() -> bool:
    """True when /dev/shm exists and is writable (it is on Linux)."""
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def write(prefix: str, buffer: memoryview) -> str:
    """Copy `buffer` into a fresh /dev/shm file and return its name."""
    name = f"{prefix}-{os.getpid()}-{next(_counter)}"
    fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(buffer).cast("B")
        # One copy, by the kernel, from the caller's buffer into fresh tmpfs pages:
        # measured ~2x faster than faulting the pages in through a writable mapping.
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except BaseException:
        os.close(fd)
        _unlink(name)
        raise
    os.close(fd)
    return name


def take(name: str, size: int) -> mmap.mmap | bytes:
    """Map the named file (writable, private to this process) and unlink it.

    The mapping outlives the name; it is released with the last reference.
    """
    if "/" in name or not name.startswith("stagevisor-"):
        raise ValueError(f"refusing shared buffer name {name!r}")
    path = SHM_DIR / name
    fd = os.open(path, os.O_RDONLY)
    try:
        _unlink(name)
        if size == 0:
            return b""
        # MAP_PRIVATE + PROT_WRITE: arrays built on it are writable, and writes
        # stay in this process (copy-on-write), like a received message's copy.
        return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def discard(name: str) -> None:
    """Unlink a buffer that will never be taken (its frame was dropped)."""
    if "/" not in name and name.startswith("stagevisor-"):
        _unlink(name)


def remove_leftovers(prefix: str) -> int:
    """Unlink every buffer of this daemon still in /dev/shm; return how many."""
    removed = 0
    for path in SHM_DIR.glob(f"{prefix}-*"):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def remove_orphans(directory: Path = SHM_DIR) -> int:
    """Unlink this user's buffers whose writer process is gone; return how many.

    A daemon killed with SIGKILL takes its workers with it (PDEATHSIG) before
    anyone can clean up, and its prefix dies with it; the next daemon sweeps
    by the writer pid every name carries (`<prefix>-<pid>-<n>`).
    """
    removed = 0
    for path in directory.glob("stagevisor-*-*-*"):
        pid_text = path.name.rsplit("-", 2)[-2]
        try:
            if not pid_text.isdigit() or path.stat().st_uid != os.getuid() or pid_alive(int(pid_text)):
                continue
            if not path.is_file():  # not one of our buffers (a directory someone else named alike)
                continue
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _unlink(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass


class SegmentPool:
    """A sender's reusable /dev/shm files, so a large handoff costs one plain copy.

    Writing into a fresh tmpfs file makes the kernel allocate and zero every
    page first; measured here that more than doubles the cost of the copy
    itself. A pooled file is overwritten in place instead. The receiver maps
    it without unlinking and sends a Release once the array built on it is
    garbage collected; only then is the file handed out again. Files that
    are never released (their receiver died) are removed with the rest of the
    daemon's prefix when the gateway stops.
    """

    def __init__(self, prefix: str, max_free: int = 8) -> None:
        self.prefix = prefix
        self.max_free = max_free
        self._free: list[tuple[str, mmap.mmap | None, int]] = []  # (name, writable mapping, capacity)
        self._busy: dict[str, tuple[str, mmap.mmap | None, int]] = {}
        self.created = 0
        """Files created so far; steady state creates none."""

    def write(self, buffer: memoryview) -> str:
        view = memoryview(buffer).cast("B")
        size = view.nbytes
        segment = self._take_free(size)
        if segment is None:
            name = f"{self.prefix}-{os.getpid()}-p{next(_counter)}"
            fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
                mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) if size else None
            finally:
                os.close(fd)
            segment = (name, mapped, size)
            self.created += 1
        name, mapped, _ = segment
        if size:
            # A plain memcpy into pages that already exist (after the first use of the file).
            mapped[:size] = view
        self._busy[name] = segment
        return name

    def release(self, name: str) -> None:
        segment = self._busy.pop(name, None)
        if segment is None:
            return
        if len(self._free) < self.max_free:
            self._free.append(segment)
        else:
            self._drop(segment)

    def busy(self) -> int:
        return len(self._busy)

    def close(self) -> None:
        for segment in [*self._free, *self._busy.values()]:
            self._drop(segment)
        self._free.clear()
        self._busy.clear()

    def _take_free(self, size: int) -> tuple[str, mmap.mmap | None, int] | None:
        # The smallest free file that fits, if it is not wastefully large.
        fitting = [s for s in self._free if size <= s[2] <= 2 * size]
        if not fitting:
            return None
        best = min(fitting, key=lambda s: s[2])
        self._free.remove(best)
        return best

    @staticmethod
    def _drop(segment: tuple[str, mmap.mmap | None, int]) -> None:
        name, mapped, _ = segment
        if mapped is not None:
            mapped.close()
        _unlink(name)


def map_pooled(name: str, size: int) -> mmap.mmap:
    """Map a pooled buffer privately (the receiver's writes stay its own); the sender keeps the name."""
    if "/" in name or not name.startswith("stagevisor-"):
        raise ValueError(f"refusing shared buffer name {name!r}")
    fd = os.open(SHM_DIR / name, os.O_RDONLY)
    try:
        return mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
