"""Whether a process is still running, for sweeping what dead daemons and workers left behind; whether it is
stopped, for saying why a worker stopped answering."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (exited, not yet reaped) no longer counts.

    A process of another user counts as alive: we may not signal it, but it exists.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def pid_stopped(pid: int) -> bool:
    """True while `pid` is stopped (SIGSTOP, SIGTSTP, a debugger): state T or t in /proc/PID/stat. False when it
    runs, sleeps, is gone, or /proc does not tell."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
