"""DeadlinePool across a fork: the child runs calls on threads of its own."""

from __future__ import annotations

import os

from stagevisor.stages.compute import DeadlinePool

WAIT = 10.0  # seconds; bounds every wait on a thread of the pool


def test_a_forked_child_starts_its_own_threads():
    """A pool used before a fork still runs calls in the child (a fork copies no thread)."""
    pool = DeadlinePool(1)
    assert pool.submit(0.0, int, "1").result(WAIT) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether the pool ran a call, then leave without pytest's teardown
        try:
            ok = pool.submit(0.0, int, "7").result(WAIT) == 7
        except BaseException:
            ok = False
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
