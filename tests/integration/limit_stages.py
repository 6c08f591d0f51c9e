"""Stages for the limits and security tests: an entry that declares a short text limit, a fast audio source (and
one whose build a test can hold)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np

from stagevisor.stages.base import StageContext, StagePayload

ENTRY_MAX_TEXT_CHARS = 64
SAMPLE_RATE = 48_000


def pipeline_config(name: str, *, split: bool = False) -> str:
    """A `--config` of these stages, `entry` -> `source`: in one process, or `split` into `front` and `back`."""
    front, back = ("front", "back") if split else ("pipeline", "pipeline")
    safe = "  process_safe_edges: [[entry, source]]\n" if split else ""
    return (
        f"pipeline:\n  name: {name}\n  stages:\n"
        f"    - name: entry\n      factory: tests.integration.limit_stages:entry\n      process: {front}\n"
        "      next: [source]\n"
        f"    - name: source\n      factory: tests.integration.limit_stages:source\n      process: {back}\n{safe}"
    )


class Entry:
    """Passes the request on; declares `max_text_chars`, which the gateway must enforce for it."""

    max_text_chars = ENTRY_MAX_TEXT_CHARS

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        text = payload.request["text"]
        assert len(text) <= self.max_text_chars, "the gateway let a text past the declared limit"
        return {}


class Source:
    """Streams `seconds` of quiet audio in one-second chunks (option `seconds`, default 1; `forever`
    until cancelled; option `chunk` for chunks of that many seconds); option `interval` sleeps that long
    between chunks, `delay` before the first."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        options = payload.request.get("options", {})
        seconds = options.get("seconds", "1")
        interval = float(options.get("interval", "0"))
        length = float(options.get("chunk", "1"))
        await asyncio.sleep(float(options.get("delay", "0")))  # before the first chunk
        remaining = float("inf") if seconds == "forever" else float(seconds)
        chunk = np.full(int(length * SAMPLE_RATE), 0.01, dtype=np.float32)
        sent = 0
        while remaining > 0 and not ctx.cancelled:
            piece = chunk[: int(min(length, remaining) * SAMPLE_RATE)]
            await ctx.stream({"audio": piece, "sample_rate": SAMPLE_RATE})
            remaining -= length
            sent += 1
            if interval:
                await asyncio.sleep(interval)
        return {"chunks": sent}


def entry() -> Entry:
    return Entry()


def source() -> Source:
    return Source()


GATE_LIMIT = 120.0
"""Seconds a gated source's build waits for its gate at most."""


async def gated_source(start_gate: str) -> Source:
    """A Source whose build waits while the file `start_gate` exists (up to GATE_LIMIT): a test holds a
    worker out of READY, as a slow model load would, for as long as it needs."""
    deadline = time.monotonic() + GATE_LIMIT
    while Path(start_gate).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return Source()
