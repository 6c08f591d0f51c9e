"""Logging for the daemon and its workers: one format, repeated lines rate-limited, one traceback per failure.

A worker that is down makes every request fail fast, and each failure used to
log a line (17,440 lines in 60 s) and a full traceback. `RepeatFilter` lets
the first few lines of each kind (one call site, one message up to its numbers
and request ids) through per period, then counts the rest and
says how many it dropped on the next line of that kind it lets through. A
traceback is printed once per distinct failure (exception type and the frames
it went through); later ones log the one-line exception only.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
from collections import OrderedDict
from typing import Callable

BURST = 5
"""Lines of one kind let through per period."""
PERIOD = 10.0
"""Seconds."""
MAX_KINDS = 1024
"""Kinds (and distinct tracebacks) remembered; the oldest are forgotten first, so memory stays bounded."""
MAX_MESSAGE_CHARS = 4000
"""A longer log message is cut, with the number of characters left out."""


_VARYING = re.compile(r"[0-9a-f]{8,}|\d+")
"""Request ids (hex) and numbers (pids, counts, ports): what differs between repeats of one message."""


class RepeatFilter(logging.Filter):
    """Rate-limits records of one kind (call site, level, message up to ids and numbers); prints each traceback once.

    Install on a handler. Records are changed in place: the one after a
    suppressed run says how many were dropped; a repeated traceback is
    replaced by its exception's one-line summary.
    """

    def __init__(self, burst: int = BURST, period: float = PERIOD, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.burst = burst
        self.period = period
        self.clock = clock
        self._windows: OrderedDict[tuple, list] = OrderedDict()  # kind -> [window start, passed, suppressed]
        self._tracebacks: OrderedDict[tuple, int] = OrderedDict()  # failure signature -> times seen

    def filter(self, record: logging.LogRecord) -> bool:
        # One kind per call site and message with its numbers and ids masked: the same failure
        # for another request or pid is a repeat; another group's transition is not.
        kind = (record.pathname, record.lineno, record.levelno, _VARYING.sub("#", record.getMessage()[:300]))
        now = self.clock()
        window = self._windows.get(kind)
        if window is None or now - window[0] >= self.period:
            suppressed = window[2] if window else 0
            window = [now, 0, 0]
            self._windows[kind] = window
            self._windows.move_to_end(kind)
            while len(self._windows) > MAX_KINDS:
                self._windows.popitem(last=False)
            if suppressed:
                _append(record, f" [{suppressed} similar messages suppressed in the previous {self.period:g}s]")
        if window[1] >= self.burst:
            window[2] += 1
            return False
        window[1] += 1
        if window[1] == self.burst:
            _append(record, f" [further messages like this are limited to {self.burst} per {self.period:g}s]")
        self._once_per_traceback(record)
        _bound(record)
        return True

    def _once_per_traceback(self, record: logging.LogRecord) -> None:
        if not record.exc_info or record.exc_info[1] is None:
            return
        error = record.exc_info[1]
        frames = tuple(
            (frame.filename, frame.lineno, frame.name) for frame in traceback.extract_tb(error.__traceback__)
        )
        signature = (type(error).__module__, type(error).__qualname__, frames)
        seen = self._tracebacks.get(signature, 0)
        self._tracebacks[signature] = seen + 1
        self._tracebacks.move_to_end(signature)
        while len(self._tracebacks) > MAX_KINDS:
            self._tracebacks.popitem(last=False)
        if seen:
            summary = "".join(traceback.format_exception_only(type(error), error)).strip()
            _append(record, f" ({summary[:500]}; traceback as logged before, seen {seen + 1} times)")
            record.exc_info = None
            record.exc_text = None


def _append(record: logging.LogRecord, text: str) -> None:
    record.msg, record.args = f"{record.getMessage()}{text}", None


def _bound(record: logging.LogRecord) -> None:
    message = record.getMessage()
    if len(message) > MAX_MESSAGE_CHARS:
        record.msg = f"{message[:MAX_MESSAGE_CHARS]}... [{len(message) - MAX_MESSAGE_CHARS} characters cut]"
        record.args = None


def configure(level: str, prefix: str) -> None:
    """Log to stderr at `level` with `prefix` (e.g. "daemon pid %(process)d") through one RepeatFilter."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s [{prefix}] %(name)s: %(message)s"))
    handler.addFilter(RepeatFilter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
