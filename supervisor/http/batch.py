"""`POST /v1/audio/speech/batch`: several speech requests in one call, each result sent as soon as it is done.

The body is `{"requests": [speech request, ...]}` (at most MAX_BATCH). Every
item is checked, admitted and run on its own, concurrently: admission
control applies per item, so under load some items get their own 429 while
others succeed. The response is NDJSON, one line per item in the order they
finish: `{"index", "status": 200, "request_id", "response_format",
"sample_rate", "audio": base64}` (a WAV with exact sizes), or `{"index",
"status": 4xx/5xx, "error": OpenAI's error object}`. A client that hangs up
cancels every item still running, and so does one that reads nothing for
--stream-idle-timeout (its response is cut), as a single request's would.
A batch holds at most MAX_BATCH_AUDIO_BYTES of audio at once (`HeldAudio`):
an item whose audio would pass it gets its own 400 line.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Sequence

from starlette.responses import StreamingResponse

from stagevisor.supervisor.dataplane.limits import AUDIO_LIMIT_EXCEEDED, progress_poll, watched_write
from stagevisor.supervisor.errors import RequestFailed, unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.http import backlog
from stagevisor.supervisor.http.audio import wav_header
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.fields import json_type
from stagevisor.supervisor.http.request import SpeechRequest
from stagevisor.supervisor.http.speech import SpeechGateway, StreamAborted, finish, open_speech, status_of

if TYPE_CHECKING:
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

log = logging.getLogger(__name__)

MAX_BATCH = 64
MAX_BATCH_BODY_BYTES = 8 * 1024 * 1024
MAX_BATCH_AUDIO_BYTES = 64 * 1024 * 1024
"""Audio a batch's items may hold at once (their results, whole, until their lines are sent): about 23 minutes of
24 kHz 16-bit PCM. Without it one batch of 64 long texts held gigabytes (each up to --max-audio-seconds)."""


class HeldAudio:
    """The audio bytes a batch's items hold until their lines are sent, bounded by `limit`: an item whose audio
    would pass it fails with its own line, and the others go on. Used from the event loop only."""

    def __init__(self, limit: int = MAX_BATCH_AUDIO_BYTES) -> None:
        self.limit = limit
        self.held = 0
        self._by_item: dict[int, int] = {}

    def take(self, index: int, size: int) -> None:
        """Item `index` holds `size` bytes more; ApiError (400, `audio_limit_exceeded`) past the limit."""
        if self.held + size > self.limit:
            raise ApiError(
                400,
                f"the batch's audio passed {self.limit / 2**20:g} MiB held at once, its cap; "
                "send long texts alone to POST /v1/audio/speech, which streams",
                param=f"requests[{index}]",
                code=AUDIO_LIMIT_EXCEEDED,
            )
        self.held += size
        self._by_item[index] = self._by_item.get(index, 0) + size

    def release(self, index: int) -> None:
        """Item `index` holds nothing any more (its line was sent, or it failed)."""
        self.held -= self._by_item.pop(index, 0)


def batch_items(data: dict[str, Any]) -> list[Any]:
    """The body's `requests`, checked as a list of at most MAX_BATCH items; ApiError names the field."""
    unknown = sorted(set(data) - {"requests"})
    if unknown:
        raise ApiError(
            400,
            f'unknown field {unknown[0]!r}; a batch is {{"requests": [...]}}',
            param=unknown[0],
            code="unknown_parameter",
        )
    items = data.get("requests")
    if items is None:  # as a speech request without `input`
        raise ApiError(
            400,
            "a batch needs 'requests', an array of speech requests: {\"requests\": [...]}",
            param="requests",
            code="missing_required_parameter",
        )
    if not isinstance(items, list) or not items:
        raise ApiError(
            400, "'requests' must be a non-empty array of speech requests", param="requests", code="invalid_value"
        )
    if len(items) > MAX_BATCH:
        raise ApiError(
            400, f"a batch holds at most {MAX_BATCH} requests, got {len(items)}", param="requests", code="invalid_value"
        )
    return items


async def run_item(
    index: int,
    item: Any,
    parse: Callable[[dict[str, Any]], Awaitable[tuple[SpeechRequest, Any]]],
    gateway: SpeechGateway,
    rate_hint: Callable[[Any], int],
    metrics: DaemonMetrics | None,
    held: HeldAudio | None = None,
) -> dict[str, Any]:
    """One item's result line: its audio whole, or its error with the status it would have had alone. The audio
    counts in `held` (a new one: this item alone) until the line is sent (`stream_results` releases it)."""
    held = HeldAudio() if held is None else held
    meter = metrics.start_request() if metrics is not None else None
    opened = False  # from open_speech on, the meter is finished there or by the stream
    succeeded = False
    try:
        if not isinstance(item, dict):
            raise ApiError(
                400,
                f"requests[{index}] must be a JSON object, got {json_type(item)}",
                param=f"requests[{index}]",
                code="invalid_type",
            )
        speech, served = await parse(item)
        if speech.stream_format != "audio":
            raise ApiError(
                400,
                f"stream_format {speech.stream_format!r} does not apply to a batch; each "
                "request's audio comes whole in its line (for events, send it alone to POST /v1/audio/speech)",
                param="stream_format",
                code="invalid_value",
            )
        opened = True
        stream = await open_speech(gateway, speech, rate_hint(served), meter)
        pieces = []
        try:
            async for piece in stream.pieces():
                held.take(index, len(piece))
                pieces.append(piece)
        finally:
            stream.close()
        audio = b"".join(pieces)
        del pieces
        if speech.response_format == "wav":  # the length is known now: exact sizes
            audio = wav_header(stream.sample_rate, len(audio) - 44) + audio[44:]
        line = {
            "index": index,
            "status": 200,
            "request_id": stream.request_id,
            "response_format": speech.response_format,
            "sample_rate": stream.sample_rate,
            "audio": base64.b64encode(audio).decode("ascii"),
        }
        succeeded = True
        return line
    except ApiError as error:
        if not opened:
            finish(meter, status_of(error))
        return {"index": index, "status": error.status, **error.body()}
    except RequestFailed as error:  # mid-stream
        failed = ApiError.from_failure(error)
        return {"index": index, "status": failed.status, **failed.body()}
    except Exception as error:
        # A daemon bug in one item: that item's line says so (class and id, the text to the log) and the
        # others still finish; raised, it would cut the whole response.
        if not opened:
            finish(meter, "UNKNOWN")
        unexpected = unexpected_failure(error)
        log.exception(
            "request %s: batch item %d failed in the daemon",
            unexpected.request_id,
            index,
            extra=promised(unexpected.request_id),
        )
        failed = ApiError.from_status(unexpected.status, unexpected.public_message(), code="internal_error")
        return {"index": index, "status": failed.status, **failed.body()}
    except BaseException:
        if not opened:
            finish(meter, "CANCELLED")
        raise
    finally:
        if not succeeded:
            held.release(index)


async def stream_results(tasks: list[asyncio.Task], held: HeldAudio) -> AsyncIterator[bytes]:
    try:
        for done in asyncio.as_completed(tasks):
            line = await done
            yield json.dumps(line, separators=(",", ":")).encode() + b"\n"
            held.release(line["index"])
    finally:
        await cancel_items(tasks)


async def cancel_items(tasks: Sequence[asyncio.Future]) -> None:
    """Stop the items still running (the client went away; each closes its request) and wait for them."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class BatchResponse(StreamingResponse):
    """The NDJSON stream of a batch's results; the items still running when the call ends are cancelled.

    Not left to the body's own `finally`: a client that leaves during a write has Starlette cancel that write,
    and the body stays suspended until the garbage collector finalizes it (a response whose start fails never
    runs it); meanwhile up to MAX_BATCH requests would run on, their slots taken, for nobody. A client that takes
    nothing of a write for `idle_timeout` seconds ends the batch the same way, and the results it holds with it;
    one that reads a long line slowly is not idle (its connection's backlog is watched, as a single request's).
    """

    def __init__(self, tasks: list[asyncio.Task], idle_timeout: float, held: HeldAudio) -> None:
        super().__init__(
            stream_results(tasks, held),
            media_type="application/x-ndjson",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self._tasks = tasks
        self._idle_timeout = idle_timeout
        self._poll_interval = progress_poll(idle_timeout)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        unsent = backlog.current()  # a line's write waiting on a client that still reads is not idle

        async def bounded(message: Any) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            write, limit = await watched_write(
                send(message), self._idle_timeout, unsent, self._poll_interval, asyncio.get_running_loop().time
            )
            if limit is None:
                write.result()
                return
            log.warning(
                "a batch's client read nothing for %g s: its items end and its response is cut", self._idle_timeout
            )
            # As on a client that left: the write is cancelled, the response, cut, ends, and the connection is
            # reset rather than closed, which would wait on the client to read what is buffered for it.
            write.cancel()
            await cancel_items([write, *self._tasks])
            backlog.reset_stalled()
            raise StreamAborted(f"the client read nothing for {self._idle_timeout:g} s")

        try:
            await super().__call__(scope, receive, bounded)
        finally:
            await cancel_items(self._tasks)


def batch_response(tasks: list[asyncio.Task], idle_timeout: float, held: HeldAudio) -> StreamingResponse:
    """The response of a batch whose items run as `tasks`, holding their audio in `held`; a client that reads
    nothing for `idle_timeout` seconds (--stream-idle-timeout) ends it."""
    return BatchResponse(tasks, idle_timeout, held)
