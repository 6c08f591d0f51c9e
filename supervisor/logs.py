"""Logging for the daemon and its workers: one format, repeated lines rate-limited, one traceback per failure.

A worker that is down makes every request fail fast, and each failure used to
log a line (17,440 lines in 60 s) and a full traceback. `RepeatFilter` lets
the first few lines of each kind (one call site, one message up to its numbers
and request ids) through per period, then counts the rest and
says how many it dropped on the next line of that kind it lets through. A
traceback is printed once per distinct failure (exception type and the frames
it went through); later ones log the one-line exception only.

A line logged with `extra=promised(request_id)` is never dropped: a client was
told that the daemon log has the details under that id. Past the burst it
passes as a summary (its message cut to SUMMARY_CHARS, the traceback left to
the once-per-failure rule), so a failure storm costs one short line per failed
request, never a traceback each.
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
MAX_TRACEBACK_CHARS = 16_000
"""A longer traceback keeps its first and last halves: the frames it went through and the exception it ended in."""
SUMMARY_CHARS = 500
"""A promised line past its kind's burst is cut to this: enough for the id, the stage, the class and the message."""
PROMISED = "stagevisor_request_id"
"""The LogRecord attribute `promised` sets: the request id a client was told to look up in the log."""


def promised(request_id: str) -> dict[str, str]:
    """`extra=` for the log line whose request id a client was given ("the daemon log has the details"):
    RepeatFilter never drops it."""
    return {PROMISED: request_id}


class RateWindow:
    """The one rate limiter: at most `burst` events per window of `period` seconds, counting the refused.

    A window opens at the first event after the last one closed (`period` after it opened). Used per kind
    of log line by RepeatFilter, and as one budget for a family of warnings by Throttled.
    """

    def __init__(self, burst: int, period: float) -> None:
        self.burst = burst
        self.period = period
        self.start: float | None = None
        self.passed = 0
        self.refused = 0

    def admit(self, now: float) -> tuple[bool, int, float]:
        """(whether this event passes, events refused in the window this one closed, how long that window ran);
        0 and 0.0 when no window closed."""
        closed, ran = 0, 0.0
        if self.start is None or now - self.start >= self.period:
            if self.start is not None:
                closed, ran = self.refused, now - self.start
            self.start, self.passed, self.refused = now, 0, 0
        if self.passed >= self.burst:
            self.refused += 1
            return False, closed, ran
        self.passed += 1
        return True, closed, ran


class Throttled:
    """A logger's warnings at most `burst` lines per `window` seconds in all (one RateWindow), then how many it
    held back. A peer sending thousands of bad frames must not turn into thousands of log lines."""

    def __init__(
        self, logger: logging.Logger, burst: int = 10, window: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._clock = clock
        self._window = RateWindow(burst, window)

    @property
    def suppressed(self) -> int:
        """Warnings held back in the current window."""
        return self._window.refused

    def warning(self, message: str, *args: object) -> None:
        passes, held, ran = self._window.admit(self._clock())
        if held:
            self._log.warning("%d more such data-plane warnings in the last %.0f s were not logged", held, ran)
        if passes:
            self._log.warning(message, *args)


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
        self._windows: OrderedDict[tuple, RateWindow] = OrderedDict()  # kind -> its window
        self._tracebacks: OrderedDict[tuple, int] = OrderedDict()  # failure signature -> times seen

    def filter(self, record: logging.LogRecord) -> bool:
        # One kind per call site and message with its numbers and ids masked: the same failure
        # for another request or pid is a repeat; another group's transition is not.
        kind = (record.pathname, record.lineno, record.levelno, _VARYING.sub("#", record.getMessage()[:300]))
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = RateWindow(self.burst, self.period)
            while len(self._windows) > MAX_KINDS:
                self._windows.popitem(last=False)
        passes, suppressed, _ = window.admit(self.clock())
        if window.passed == 1 and window.refused == 0:  # a window just opened: this kind is fresh again
            self._windows.move_to_end(kind)
        if record.__dict__.get(PROMISED):
            # The client holds this id and was sent here: the line always passes, past the burst as a summary.
            self._once_per_traceback(record)
            _bound(record, MAX_MESSAGE_CHARS if passes else SUMMARY_CHARS)
            return True
        if suppressed:
            _append(record, f" [{suppressed} similar messages suppressed in the previous {self.period:g}s]")
        if not passes:
            return False
        if window.passed == self.burst:
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


def _bound(record: logging.LogRecord, limit: int = MAX_MESSAGE_CHARS) -> None:
    """Cut the message to `limit` and the traceback to MAX_TRACEBACK_CHARS (each of its lines to `limit`): an
    exception whose text holds a payload (a megabyte repr) is one readable entry, not the payload."""
    message = record.getMessage()
    if len(message) > limit:
        record.msg = f"{message[:limit]}... [{len(message) - limit} characters cut]"
        record.args = None
    if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
        record.exc_text = bounded_traceback("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"), limit)


def bounded_traceback(text: str, line_limit: int = MAX_MESSAGE_CHARS, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """`text` with each line cut to `line_limit` and the whole to `limit` (its middle cut), saying what was cut."""
    lines = [
        line if len(line) <= line_limit else f"{line[:line_limit]}... [{len(line) - line_limit} characters cut]"
        for line in text.split("\n")
    ]
    text = "\n".join(lines)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters of traceback cut] ...\n{text[-half:]}"


def _formatter(prefix: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s %(levelname)s [{prefix}] %(name)s: %(message)s")


class _PrefixedHandler(logging.StreamHandler):
    """The stderr handler `configure` installs: `rename` finds it to change its prefix."""


def configure(level: str, prefix: str) -> None:
    """Log to stderr at `level` with `prefix` (e.g. "daemon pid %(process)d") through one RepeatFilter."""
    handler = _PrefixedHandler(sys.stderr)
    handler.setFormatter(_formatter(prefix))
    handler.addFilter(RepeatFilter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])


def rename(prefix: str) -> None:
    """Write the lines from now on with `prefix` instead of `configure`'s (a worker a scale renamed)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _PrefixedHandler):
            handler.setFormatter(_formatter(prefix))
