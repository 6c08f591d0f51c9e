"""Which of this process's descriptors are open on a test's own files: a leak check other threads cannot disturb.

Comparing the whole of /proc/self/fd before and after is no leak check in a
pytest process: other threads open and close descriptors at any moment. The
suite's own leftover check (tests/conftest.py) reads /proc ten times a second
from a thread, and gRPC, asyncio executors and daemon readers left by earlier
tests do the same. Under load such a thread holds a descriptor across the
snapshot, and the listing's own descriptor takes another number. Nobody but
the code under test opens a file inside the test's own directory, so counting
only those is exact.
"""

from __future__ import annotations

import os
from pathlib import Path

DELETED = " (deleted)"
"""What the kernel appends to the target of a descriptor whose file has since been unlinked."""


def descriptors_on(path: Path) -> dict[int, str]:
    """This process's descriptors open on `path` or on anything under it, unlinked or not: {fd: target}."""
    root = os.path.realpath(path)
    found = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # closed meanwhile: the listing's own descriptor, or another thread's
            continue
        file = target.removesuffix(DELETED)
        if file == root or file.startswith(root + os.sep):
            found[int(entry)] = target
    return found
