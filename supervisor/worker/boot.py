"""The first code a worker process runs: notes when its interpreter is up, then imports and runs worker.main.

A leaf on purpose (stdlib only): for a spawned worker, the time until this
runs is the interpreter's start; what worker.main needs is imported after it,
so the READY handshake can tell the two apart (daemon/handle.py: Handshake.phases).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def main(spec: Any, handshake: Any, lifeline: Any, heartbeat_interval: float = 0.0, activation: Any = None) -> None:
    """Target of the worker's multiprocessing.Process (see launcher.Launcher.start); `activation`: a standby's pipe."""
    entered = time.time()
    # A process group of its own: a signal to the daemon's group (Ctrl-C, `timeout`, `kill -- -PGID`) reaches
    # only the daemon, which drains, then stops its workers; a worker stopping by itself would break requests
    # still running in the others. Writing to the terminal from outside its foreground group is then allowed
    # only with SIGTTOU ignored (`stty tostop` would stop the worker at its first log line).
    os.setpgid(0, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    # Forked from the fork server, which ignores SIGTERM (worker/fork_server.py): the daemon stops workers with it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    from stagevisor.supervisor.worker import main as worker

    worker.main(
        spec,
        handshake,
        lifeline,
        heartbeat_interval,
        stamps={"entered": entered, "imported": time.time()},
        activation=activation,
    )
