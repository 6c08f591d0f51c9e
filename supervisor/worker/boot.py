"""The first code a worker process runs: notes when its interpreter is up, then imports and runs worker.main.

A leaf on purpose (stdlib only): for a spawned worker, the time until this
runs is the interpreter's start; what worker.main needs is imported after it,
so the READY handshake can tell the two apart (launcher.Handshake.phases).
"""

from __future__ import annotations

import time
from typing import Any


def main(spec: Any, handshake: Any, lifeline: Any, heartbeat_interval: float = 0.0, activation: Any = None) -> None:
    """Target of the worker's multiprocessing.Process (see launcher.Launcher.start); `activation`: a standby's pipe."""
    entered = time.time()
    from stagevisor.supervisor.worker import main as worker

    worker.main(
        spec,
        handshake,
        lifeline,
        heartbeat_interval,
        stamps={"entered": entered, "imported": time.time()},
        activation=activation,
    )
