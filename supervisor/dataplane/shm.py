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


def _unlink(name: str) -> None:
    try:
        os.unlink(SHM_DIR / name)
    except FileNotFoundError:
        pass
