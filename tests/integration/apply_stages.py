"""Factories for the apply tests: one that raises (the new topology's worker cannot build its stage), one that
builds slowly on request (the others of the new topology are READY meanwhile)."""

import os
import time
from typing import Any


def broken(**kwargs: object) -> None:
    raise RuntimeError("this factory raises on purpose")


def vocoder_after_marker() -> Any:
    """The default voice's vocoder, whose build waits while the file HOLD_MARKER names exists."""
    while os.path.exists(os.environ["HOLD_MARKER"]):
        time.sleep(0.1)
    from stagevisor.stages.hibari.executors import vocoder

    return vocoder()
