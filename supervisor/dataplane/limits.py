"""Per-request limits of the public endpoints: field lengths, an audio-duration cap, a deadline, an idle timeout.

Shared by the gRPC Synthesis service and the HTTP API, so both refuse and cut
off requests the same way. Field checks are pure; `RequestGuard` wraps one
request's chunk stream and its writes to the client, and `ReadProgress` is its
rule for when a client whose write waits counts as idle.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, TypeVar

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS
from stagevisor.supervisor.errors import RequestFailed

MAX_VOICE_CHARS = 128
"""Longest voice or speaker name accepted."""
MAX_REFERENCE_TRANSCRIPT_CHARS = 2000
"""Longest transcript of the reference audio (3 MiB of 16-bit audio is about a minute of speech)."""
CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f]")
"""Control characters (C0, DEL and C1) other than tab and line breaks (U+0085 NEL is one): no text front end can
speak them."""
ECHO_CHARS = 40
"""At most this much of a rejected value is quoted back in an error message."""

T = TypeVar("T")

# `asyncio.timeout` (Python 3.11 and later) times a chunk's wait with a timer; on 3.10 the guard uses wait_for.
_timeout: Callable[[float], Any] | None
if sys.version_info >= (3, 11):
    _timeout = asyncio.timeout
else:
    _timeout = None

Backlog = Callable[[], "int | None"]
"""Reads how many bytes written to a client it has not taken yet (None: not known at this reading). While a write
waits, a reading lower than the one before is the client reading: a slow reader is not an idle one."""

PROGRESS_POLL = 1.0
"""Seconds between readings of a client's backlog while a write to it waits (a quarter of the idle timeout where
that is shorter): the idle timeout is kept to about this much."""


def progress_poll(idle: float) -> float:
    """Seconds between readings of a waiting client's backlog under an idle timeout of `idle` seconds."""
    return min(PROGRESS_POLL, idle / 4)


PEER_SHARE = 0.5
"""Of a worker's request table, the most one inbound link (one peer) may hold: the rest stays free for the
others, so one peer opening requests without end cannot starve them."""


def per_peer_cap(max_requests: int) -> int:
    """Requests one inbound link may hold at once in a table of `max_requests` (at least 1)."""
    return max(1, int(max_requests * PEER_SHARE))


class InvalidSynthesisRequest(ValueError):
    """The client's request is malformed; it gets INVALID_ARGUMENT (HTTP 400) with this message.

    `field` names the request field at fault (`text`, `voice`, `reference_transcript`, `reference_audio`, an
    option's key), or is empty when no single field is; the HTTP API reports it as `param`.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def check_unicode(field: str, value: str) -> None:
    """InvalidSynthesisRequest when `value` holds a lone surrogate (JSON can carry one: "\\ud800"; UTF-8 cannot)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidSynthesisRequest(
            f"{field} is not valid Unicode: a lone surrogate (U+{ord(value[error.start]):04X}) at position "
            f"{error.start}; send the text as UTF-8",
            field,
        ) from None


AUDIO_LIMIT_EXCEEDED = "audio_limit_exceeded"
"""The code of a request ended by the audio cap: RESOURCE_EXHAUSTED to gRPC, but not a rate limit over HTTP."""


class LimitExceeded(RequestFailed):
    """A running request hit a limit. `status` is a grpc.StatusCode name; `message` is for the client.

    `stalled_write` is the write to the client still pending when the limit
    hit, if any: gRPC accepts no status while a message is in flight, so the
    caller ends the request in the pipeline first, then awaits it (it ends
    when the client reads again or goes away) before reporting the status.
    """

    def __init__(
        self, status: str, message: str, stalled_write: "asyncio.Future[Any] | None" = None, *, code: str = ""
    ) -> None:
        super().__init__(status, message, code=code)
        self.stalled_write = stalled_write


@dataclass(frozen=True)
class RequestLimits:
    """Caps on what one request may cost; every value is in seconds of audio or of wall time.

    `max_audio_seconds` ends a request whose audio passes it (RESOURCE_EXHAUSTED);
    `request_timeout` ends one that runs longer (DEADLINE_EXCEEDED);
    `stream_idle_timeout` ends one whose client reads nothing for that long,
    so a client that never reads its stream cannot hold a worker forever.
    """

    max_audio_seconds: float = 600.0
    request_timeout: float = 300.0
    stream_idle_timeout: float = 60.0
    pipeline_idle_timeout: float = 120.0
    """The gateway fails a request (UNAVAILABLE) when the pipeline sends it nothing for this long: no request
    outlives a worker that cannot answer it (one restarted while the daemon had no descriptor left, say)."""

    def __post_init__(self) -> None:
        for name in ("max_audio_seconds", "request_timeout", "stream_idle_timeout", "pipeline_idle_timeout"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value!r}")


def quote(value: str) -> str:
    """`value` for an error message, cut to ECHO_CHARS characters."""
    return repr(value[:ECHO_CHARS] + ("..." if len(value) > ECHO_CHARS else ""))


def check_request_fields(request: Mapping[str, Any], max_text_chars: int = DEFAULT_MAX_TEXT_CHARS) -> None:
    """Raise InvalidSynthesisRequest when text, voice or reference transcript is empty, too long or unspeakable.

    `max_text_chars` is the limit the pipeline's executors declare (see
    `stagevisor.stages.base.DEFAULT_MAX_TEXT_CHARS`).
    """
    text = request.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InvalidSynthesisRequest("text is empty; give the sentence to synthesize", "text")
    if len(text) > max_text_chars:
        raise InvalidSynthesisRequest(
            f"text has {len(text)} characters; the limit is {max_text_chars}, split it into several requests", "text"
        )
    voice = request.get("voice") or ""
    if len(voice) > MAX_VOICE_CHARS:
        raise InvalidSynthesisRequest(
            f"voice has {len(voice)} characters; a voice name has at most {MAX_VOICE_CHARS}", "voice"
        )
    transcript = request.get("reference_transcript") or ""
    if len(transcript) > MAX_REFERENCE_TRANSCRIPT_CHARS:
        raise InvalidSynthesisRequest(
            f"reference_transcript has {len(transcript)} characters; the limit is {MAX_REFERENCE_TRANSCRIPT_CHARS}",
            "reference_transcript",
        )
    for field, value in (("text", text), ("voice", voice), ("reference_transcript", transcript)):
        check_unicode(field, value)
        control = CONTROL_CHARACTER.search(value)
        if control:
            raise InvalidSynthesisRequest(
                f"{field} contains the control character {control.group()!r} at position {control.start()}; remove it",
                field,
            )


def audio_seconds(chunk: Any) -> float:
    """Seconds of audio in a terminal chunk `{"audio": samples, "sample_rate": Hz}` (0 for anything else)."""
    try:
        samples = chunk["audio"]
        rate = int(chunk["sample_rate"])
        count = int(samples.size) if hasattr(samples, "size") else len(samples)
    except (KeyError, TypeError, ValueError):
        return 0.0
    return count / rate if rate > 0 else 0.0


async def bounded_write(write: Awaitable[T], timeout: float) -> asyncio.Future[T]:
    """Await one write to a client for at most `timeout` seconds: its task, done, or still pending when the client
    took nothing for that long (left to the caller: gRPC cannot cancel one message). A caller cancelled meanwhile
    (the client went away: the call is over) cancels the write too."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.wait({task}, timeout=max(0.0, timeout))
    except asyncio.CancelledError:
        task.cancel()
        raise
    return task


class ReadProgress:
    """When the client of one pending write counts as idle: `idle` seconds after it last took any bytes.

    Pure: the caller reads the client's backlog (see `Backlog`) now and then and
    passes each reading here; a reading lower than the previous one is progress,
    and the idle time starts again from it. A reading of None (not known) is no
    progress, and leaves the previous reading to compare the next one with.
    """

    def __init__(self, idle: float, now: float, backlog: int | None = None) -> None:
        self.idle = idle
        self.idle_at = now + idle
        """When the client is idle unless a reading before then shows progress."""
        self._last = backlog

    def observe(self, now: float, backlog: int | None) -> bool:
        """Take a reading made at `now`; True when it shows the client took bytes since the last one."""
        if backlog is None:
            return False
        progressed = self._last is not None and backlog < self._last
        self._last = backlog
        if progressed:
            self.idle_at = now + self.idle
        return progressed


async def watched_write(
    write: Awaitable[T],
    idle: float,
    backlog: Backlog | None,
    poll: float,
    clock: Callable[[], float],
    deadline: float = math.inf,
) -> tuple[asyncio.Future[T], str | None]:
    """Await one write to a client until it is done, its client is idle (`ReadProgress`, reading `backlog` every
    `poll` seconds; without a backlog, the write must be done within `idle`) or `deadline` (by `clock`) passes.

    Returns the write's task, done or still pending, and the limit it ran into: None, "idle" or "deadline". A
    caller cancelled meanwhile cancels the write too (`bounded_write`).
    """
    poll = poll if backlog is not None else math.inf
    progress = ReadProgress(idle, clock(), backlog() if backlog is not None else None)
    task: asyncio.Future[T] = asyncio.ensure_future(write)
    while True:
        now = clock()
        remaining = deadline - now
        idle_left = progress.idle_at - now
        task = await bounded_write(task, min(remaining, idle_left, poll))
        if task.done():
            return task, None
        # Which bound the wait ran to decides, not a second look at the clock: a clock that stands still (a
        # test's) must not make this loop spin.
        if remaining <= min(idle_left, poll):
            return task, "deadline"
        progressed = backlog is not None and progress.observe(clock(), backlog())
        if idle_left <= poll and not progressed:
            return task, "idle"


class RequestGuard:
    """Enforces RequestLimits on one request: wrap its chunk iterator and every write to the client.

        guard = RequestGuard(limits)
        async for chunk in guard.chunks(handle):
            await guard.send(context.write(message))

    Raises LimitExceeded; the caller then closes the request (which cancels it
    in every worker) and reports the error to the client.
    """

    def __init__(
        self, limits: RequestLimits, clock: Callable[[], float] | None = None, poll_interval: float | None = None
    ) -> None:
        self.limits = limits
        self._clock = clock or asyncio.get_running_loop().time
        self.deadline = self._clock() + limits.request_timeout
        self.audio_seconds = 0.0
        self.poll_interval = poll_interval if poll_interval is not None else progress_poll(limits.stream_idle_timeout)
        """Seconds between readings of the client's backlog while a write waits (`send`)."""

    def _remaining(self) -> float:
        return self.deadline - self._clock()

    def _deadline_exceeded(self) -> LimitExceeded:
        return LimitExceeded(
            "DEADLINE_EXCEEDED",
            f"the request ran longer than {self.limits.request_timeout:g} s, the server's request timeout "
            "(--request-timeout); split the text into several requests",
        )

    def count(self, chunk: Any) -> None:
        """Add a terminal chunk's audio to the request's total; LimitExceeded past max_audio_seconds."""
        self.audio_seconds += audio_seconds(chunk)
        if self.audio_seconds > self.limits.max_audio_seconds:
            raise LimitExceeded(
                "RESOURCE_EXHAUSTED",
                f"the request produced more than {self.limits.max_audio_seconds:g} s of audio, the per-request "
                "cap (--max-audio-seconds); split the text into several requests",
                code=AUDIO_LIMIT_EXCEEDED,
            )

    async def chunks(self, iterable: Any) -> AsyncIterator[Any]:
        """The request's chunks, each counted; LimitExceeded past the deadline or the audio cap."""
        iterator = iterable.__aiter__()
        while True:
            remaining = self._remaining()
            if remaining <= 0:
                raise self._deadline_exceeded()
            try:
                if _timeout is not None:  # a timer per chunk; wait_for would also make a task per chunk
                    async with _timeout(remaining):
                        chunk = await iterator.__anext__()
                else:
                    chunk = await asyncio.wait_for(iterator.__anext__(), remaining)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                raise self._deadline_exceeded() from None
            self.count(chunk)
            yield chunk

    async def send(self, write: Awaitable[T], backlog: Backlog | None = None) -> T:
        """Await one write to the client; LimitExceeded when the client takes nothing of it for the idle timeout,
        or when it is still pending at the deadline.

        `backlog`, when given, is read every `poll_interval` seconds while the
        write waits: a client whose backlog falls is reading, however slowly
        (one write can wait for megabytes of socket buffer to drain), and its
        idle time starts again (`ReadProgress`). Without one, the write itself
        must complete within the idle timeout.

        The stalled write is not cancelled (gRPC cannot cancel one message);
        it travels in the exception as `stalled_write`.
        """
        idle = self.limits.stream_idle_timeout
        task, limit = await watched_write(write, idle, backlog, self.poll_interval, self._clock, self.deadline)
        if limit is None:
            return task.result()
        if limit == "deadline":
            error = self._deadline_exceeded()
            error.stalled_write = task
            raise error
        raise LimitExceeded(
            "DEADLINE_EXCEEDED",
            f"the client read no audio for {idle:g} s (--stream-idle-timeout); the request was cancelled",
            stalled_write=task,
        )
