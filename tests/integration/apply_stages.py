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


class HeldVocoder:
    """The default voice's vocoder, whose requests wait while the file HOLD_MARKER names exists (at most 60 s);
    a request that waits first creates HOLD_MARKER + '.reached'."""

    def __init__(self) -> None:
        from stagevisor.stages.hibari.executors import vocoder

        self._vocoder = vocoder()

    async def process(self, payload: Any, ctx: Any) -> Any:
        import asyncio

        marker = os.environ["HOLD_MARKER"]
        if os.path.exists(marker):
            open(marker + ".reached", "w").close()
            deadline = time.monotonic() + 60
            while os.path.exists(marker) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return await self._vocoder.process(payload, ctx)


def held_vocoder() -> HeldVocoder:
    return HeldVocoder()
