"""WebSocket `/v1/audio/speech/stream`: text comes in pieces (as an LLM writes it), speech leaves by sentence.

The client sends JSON text messages:

- `{"type": "start", ...}` first, optionally: the speech fields of a POST
  (model, voice, sample_rate, instructions, options...), without `input`;
  `response_format` is `pcm` (16-bit mono, 24 kHz unless `sample_rate`). An
  uploaded voice it names is read then, once: it is the session's voice to
  its end, though it is deleted (or uploaded anew) meanwhile.
- `{"type": "text", "text": "..."}`: more text; each complete sentence is
  spoken as soon as it is complete (and the one before it has been spoken);
  a piece with no letter or digit (an emoji alone, "...") is skipped, and so
  is a sentence the model refuses as NOTHING_SPEAKABLE (no sound in it). A
  single period after an abbreviation, an initial or a word with periods
  inside (`Dr.`, `J.`, `e.g.`), or before a lowercase letter, ends none.
- `{"type": "end"}`: no more text; what is left is spoken, then the server
  sends `{"type": "done"}` and closes (1000).
- `{"type": "cancel"}`: stop now; the sentence being spoken is cancelled in
  the workers, nothing more is spoken, the server closes (1000); also after
  `end`, while the rest is spoken (nothing else may come after `end`).

The server sends, per sentence, `{"type": "audio.start", "sentence", "text",
"sample_rate", "request_id"}`, binary frames of PCM, then `{"type":
"audio.done", "sentence", "audio_seconds"}`. An error is `{"type": "error",
"error": OpenAI's error object}`; a bad message or a failed sentence ends the
session with a close code (1008 a bad message or request, 1013 busy or
unavailable: retry later, 1011 server error). The start message is checked
as it arrives, as a POST's fields are. Every sentence is one pipeline request
through admission control, so the session holds at most one request slot at
a time; a cancel, a disconnect or an idle client (no message for
--stream-idle-timeout while nothing is being spoken) releases it at once, and
so does a client that reads no audio for --stream-idle-timeout while a
sentence is spoken (its session ends without a close frame, which could not
reach it either); one that reads slowly but steadily is served to the end.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Awaitable, Callable, Mapping

from starlette.websockets import WebSocket, WebSocketDisconnect

from stagevisor.stages.base import NOTHING_SPEAKABLE

from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest, LimitExceeded, check_unicode
from stagevisor.supervisor.errors import RequestFailed, shown, unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.http import backlog
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.body import parse_json_object
from stagevisor.supervisor.http.request import SpeechRequest
from stagevisor.supervisor.http.speech import SpeechGateway, finish, open_speech, status_of

log = logging.getLogger("stagevisor.http")

MAX_SESSION_CHARS = 100_000
"""Text one session may send in all; a longer text belongs in several sessions."""
MAX_MESSAGE_CHARS = 20_000
MAX_SENTENCE_CHARS = 400
"""Text without a sentence end is cut at a space once this long, so a run-on text still starts speaking."""
SENTENCE_END = re.compile(
    r"[.!?;:\u2026]+[\"')\]]*(?:\s+|$)"  # Latin ends: a space (or the end) after them
    r"|[\u3002\uff01\uff1f]+[\u300d\u300f\"')\]]*\s*"  # CJK full stops: none needed
    r"|\n+"
)
ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt ft vs etc fig figs vol eq approx dept est inc ltd corp gen col lt sgt capt "
    "rev hon jan feb apr jun jul aug sep sept oct nov dec".split()
)
"""Words a single period after does not end a sentence at (`Dr. Smith`), beside initials (`J. K.`) and words
with periods inside (`e.g.`, `U.S.`). Abbreviations that are also common words ending sentences are left out
(`no`, `sun`, `sat`, `mar`, `co`)."""
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_ERROR, CLOSE_BUSY = 1000, 1008, 1011, 1013
PROBE_INPUT = "a"
"""The text a start message is checked with: its fields are checked as a POST with some input would be."""
MAX_CLOSE_REASON_BYTES = 123
"""A close frame's payload is at most 125 bytes, two of them the code (RFC 6455 5.5): the reason is UTF-8."""


def close_reason(message: str) -> str:
    """`message` cut to what a close frame holds: MAX_CLOSE_REASON_BYTES of UTF-8, never half a character."""
    return message.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


def close_code(error: ApiError) -> int:
    """The close code for `error`: 1013 (try again later) for a refusal under load or an unavailable pipeline,
    1011 for another server fault (a FAILED process group among them: no retry passes until it is restarted),
    1008 for a bad message or request."""
    if error.status in (429, 503) and error.code != "group_failed":
        return CLOSE_BUSY
    return CLOSE_ERROR if error.status >= 500 else CLOSE_POLICY


class SentenceSplitter:
    """Text pieces in, complete sentences out, in order."""

    def __init__(self, max_chars: int = MAX_SENTENCE_CHARS) -> None:
        self.max_chars = max_chars
        self._buffer = ""

    def push(self, text: str) -> list[str]:
        """The sentences `text` completes (a sentence end is only sure once the next character has come)."""
        self._buffer += text
        sentences = []
        while True:
            buffer = self._buffer
            match = next(
                (m for m in SENTENCE_END.finditer(buffer) if m.end() < len(buffer) and ends_sentence(buffer, m)), None
            )
            if match is not None:
                cut = match.end()
            elif len(self._buffer) > self.max_chars:
                space = self._buffer.rfind(" ", 0, self.max_chars)
                cut = space + 1 if space > 0 else self.max_chars
            else:
                break
            sentence, self._buffer = self._buffer[:cut].strip(), self._buffer[cut:]
            if speakable(sentence):
                sentences.append(sentence)
        return sentences

    def flush(self) -> list[str]:
        sentence, self._buffer = self._buffer.strip(), ""
        return [sentence] if speakable(sentence) else []


def ends_sentence(text: str, end: re.Match[str]) -> bool:
    """Whether `end`, a SENTENCE_END match followed by more of `text`, ends a sentence: not a single period after
    an abbreviation, an initial or a word with periods inside (`Dr. Smith`, `J. K.`, `e.g. this`), nor one
    followed by a lowercase letter (`etc. and`)."""
    if end.group().rstrip("\"')] \t\r\f\v") != ".":
        return True
    before = text[max(0, end.start() - 40) : end.start()].split()  # the word before the period (the last 40 chars)
    word = before[-1].lstrip("\"'([") if before else ""
    if word.casefold() in ABBREVIATIONS or "." in word or (len(word) == 1 and word.isalpha()):
        return False
    return not text[end.end()].islower()


def speakable(text: str) -> bool:
    """Whether `text` has a letter or a digit. A piece of an LLM's text without one (an emoji alone, "...", a
    markdown rule "---") is not spoken: as its own request it would fail as nothing speakable and end the session."""
    return any(character.isalnum() for character in text)


class SessionEnd(Exception):
    """End the session: an error to send (or None) and the close code."""

    def __init__(self, code: int, error: ApiError | None = None, *, unreachable: bool = False) -> None:
        super().__init__(error.message if error else "")
        self.code = code
        self.error = error
        self.unreachable = unreachable
        """The client stopped reading: nothing more is sent, not even the close frame."""


async def speech_session(
    websocket: WebSocket,
    parse: Callable[[dict[str, Any]], Awaitable[tuple[SpeechRequest, Any]]],
    gateway: SpeechGateway,
    rate_hint: Callable[[Any], int],
    default_model: str,
) -> None:
    """Serve one WebSocket session until end, cancel, an error, an idle timeout or a disconnect."""
    await websocket.accept()
    limits = gateway.limits
    sentences: asyncio.Queue[str | None] = asyncio.Queue()
    session = _Session(websocket, parse, gateway, rate_hint, default_model)
    speaker = asyncio.create_task(session.speak(sentences))
    try:
        await _read(websocket, session, sentences, speaker, limits.stream_idle_timeout)
        await speaker  # `end`: the rest is spoken, then done
        await websocket.send_json({"type": "done", "sentences": session.spoken})
        await websocket.close(CLOSE_NORMAL)
    except SessionEnd as end:
        await _finish(speaker)
        if end.unreachable:
            # The client reads nothing: an error or a close frame would wait behind the audio it left, and so
            # would a close of the connection; it is reset.
            backlog.reset_stalled()
            return
        if end.error is not None:
            await _send_quietly(websocket, {"type": "error", **end.error.body()})
        await _close_quietly(websocket, end.code, close_reason(end.error.message) if end.error else "")
    except WebSocketDisconnect:
        pass  # the client went away: `finally` cancels its sentence, which releases its slot
    except Exception as error:  # a daemon bug: the client gets its class and an id, the log the rest
        unexpected = unexpected_failure(error)
        log.exception(
            "request %s: WebSocket session failed in the daemon",
            unexpected.request_id,
            extra=promised(unexpected.request_id),
        )
        failed = ApiError.from_status(unexpected.status, unexpected.public_message(), code="internal_error")
        await _finish(speaker)
        await _send_quietly(websocket, {"type": "error", **failed.body()})
        await _close_quietly(websocket, CLOSE_ERROR, close_reason(failed.message))
    finally:
        await _finish(speaker)


async def _finish(task: asyncio.Task) -> None:
    if not task.done():
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _send_quietly(websocket: WebSocket, message: dict[str, Any]) -> None:
    try:
        await websocket.send_json(message)
    except Exception:  # noqa: BLE001 - the client is already gone
        pass


async def _close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    try:
        await websocket.close(code, reason)
    except Exception:  # noqa: BLE001 - the client is already gone
        pass


async def _read(
    websocket: WebSocket,
    session: "_Session",
    sentences: asyncio.Queue,
    speaker: asyncio.Task,
    idle_timeout: float,
) -> None:
    """Read client messages until `end` (returns) or cancel / a bad message / idleness (SessionEnd)."""
    splitter = SentenceSplitter()
    received = 0
    first = True
    while True:
        receive = asyncio.ensure_future(websocket.receive())
        done, _ = await asyncio.wait({receive, speaker}, timeout=idle_timeout, return_when=asyncio.FIRST_COMPLETED)
        if speaker in done:
            receive.cancel()
            await asyncio.gather(receive, return_exceptions=True)
            speaker.result()  # raises the SessionEnd of a failed sentence
        if receive not in done:
            receive.cancel()
            await asyncio.gather(receive, return_exceptions=True)
            if sentences.empty() and not session.speaking:
                raise SessionEnd(
                    CLOSE_POLICY,
                    ApiError(408, f"no message for {idle_timeout:g} s; the session is closed", code="idle_timeout"),
                )
            continue
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = _message(message)
        kind = data.get("type")
        if kind == "start" and first:
            await session.configure(data)
        elif kind == "start":
            raise _bad("'start' comes only as the first message", "type")
        elif kind == "text":
            text = data.get("text")
            if not isinstance(text, str) or len(text) > MAX_MESSAGE_CHARS:
                raise _bad(f"'text' must be a string of at most {MAX_MESSAGE_CHARS} characters", "text")
            try:
                check_unicode("text", text)  # here, not in the sentence it would end up in: `text` is the field
            except InvalidSynthesisRequest as error:
                raise _bad(str(error), "text") from None
            received += len(text)
            if received > MAX_SESSION_CHARS:
                raise _bad(f"a session takes at most {MAX_SESSION_CHARS} characters of text; open another", "text")
            for sentence in splitter.push(text):
                sentences.put_nowait(sentence)
        elif kind == "end":
            for sentence in splitter.flush():
                sentences.put_nowait(sentence)
            sentences.put_nowait(None)
            await _until_spoken(websocket, speaker)
            return
        elif kind == "cancel":
            raise SessionEnd(CLOSE_NORMAL)
        else:
            expected = "start (first), text, end or cancel"
            if kind is None:
                raise _bad(f"a message needs a 'type': {expected}", "type")
            raise _bad(f"message type {shown(kind)} is not one of {expected}", "type")
        first = False


async def _until_spoken(websocket: WebSocket, speaker: asyncio.Task) -> None:
    """After `end`: wait until the rest is spoken, still reading the client, whose `cancel` stops it then too (a
    voice app sends `end` with the last of a reply, and its user may press stop after); any other message is
    refused. No idle timeout: the session is speaking."""
    while True:
        receive = asyncio.ensure_future(websocket.receive())
        done, _ = await asyncio.wait({receive, speaker}, return_when=asyncio.FIRST_COMPLETED)
        if speaker in done:
            receive.cancel()
            await asyncio.gather(receive, return_exceptions=True)
            speaker.result()  # raises the SessionEnd of a failed sentence
            return
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        kind = _message(message).get("type")
        if kind == "cancel":
            raise SessionEnd(CLOSE_NORMAL)
        raise _bad(f"after 'end' only 'cancel' may come, got {shown(kind)}", "type")


def _bad(message: str, param: str | None) -> SessionEnd:
    return SessionEnd(CLOSE_POLICY, ApiError(400, message, param=param, code="invalid_message"))


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    text = message.get("text")
    if text is None:
        raise _bad('messages are JSON text ({"type": ...}); binary messages are not accepted', None)
    try:  # a body's rules: NaN is no number, a key comes once, nesting past the recursion limit is the client's
        return parse_json_object(text, "a message")
    except ApiError as error:
        raise _bad(error.message, None) from None


class _Session:
    """One session's settings and the sentence loop."""

    def __init__(
        self,
        websocket: WebSocket,
        parse: Callable[[dict[str, Any]], Awaitable[tuple[SpeechRequest, Any]]],
        gateway: SpeechGateway,
        rate_hint: Callable[[Any], int],
        default_model: str,
    ) -> None:
        self.websocket = websocket
        self.parse = parse
        self.gateway = gateway
        self.rate_hint = rate_hint
        self.fields: dict[str, Any] = {"model": default_model, "response_format": "pcm"}
        self.voice: tuple[bytes, str] | None = None
        """The uploaded voice the start message named, as read then: (its audio, the transcript sent with it)."""
        self.spoken = 0
        self.speaking = False
        self.unsent = backlog.current()
        """The connection's backlog: a frame's write that waits on a client still reading is not idle."""

    async def configure(self, data: dict[str, Any]) -> None:
        """Take the start message's fields, checked now (model, voice, speed, unknown fields...), not at the
        first sentence: a session that ends before any text still hears what was wrong."""
        # null is a field not given, as in a POST; here `model` too, which the session defaults to the served one.
        fields = {k: v for k, v in data.items() if k != "type" and v is not None}
        if "input" in fields:
            raise _bad("'input' comes in text messages, not in start", "input")
        if fields.get("response_format", "pcm") != "pcm":
            raise _bad("the stream sends pcm (16-bit mono); set sample_rate for another rate", "response_format")
        if fields.get("stream_format", "audio") != "audio":
            raise _bad("the stream sends binary audio frames; stream_format does not apply", "stream_format")
        fields = {**self.fields, **fields}
        try:
            probe, _ = await self.parse({**fields, "input": PROBE_INPUT})
        except ApiError as error:
            raise SessionEnd(close_code(error), error) from None
        self.fields = fields
        # An uploaded voice is read here, once, and is the session's voice to its end: each sentence read it again,
        # so one after a DELETE was spoken without it (a model that declares no voices took the name for one of
        # its own) or ended the session on voice_not_found, and one after a new upload of the name in that voice.
        from_upload = probe.reference_audio and fields.get("ref_audio") is None
        self.voice = (probe.reference_audio, probe.reference_text) if from_upload else None

    async def speak(self, sentences: asyncio.Queue) -> None:
        while (sentence := await sentences.get()) is not None:
            self.speaking = True
            try:
                spoken = await self._sentence(sentence)
            finally:
                self.speaking = False
            self.spoken += spoken

    def _fields(self, text: str) -> dict[str, Any]:
        """A sentence's request fields: the session's, less the uploaded voice's name (and a transcript sent for
        it), which the voice read at start stands in for (`voice`)."""
        if self.voice is None:
            return {**self.fields, "input": text}
        return {**{k: v for k, v in self.fields.items() if k not in ("voice", "ref_text")}, "input": text}

    async def _sentence(self, text: str) -> bool:
        """Speak one sentence; False when the model found nothing to say in it (skipped, as a piece with no letter
        or digit is); SessionEnd when it failed."""
        metrics = self.gateway.metrics
        meter = metrics.start_request() if metrics else None
        try:
            try:
                speech, served = await self.parse(self._fields(text))
                if self.voice is not None:
                    speech.reference_audio, speech.reference_text = self.voice
            except ApiError as error:  # counted as POST /v1/audio/speech counts the same fields refused
                finish(meter, status_of(error))
                raise
            stream = await open_speech(self.gateway, speech, self.rate_hint(served), meter)
        except ApiError as error:
            if error.code == NOTHING_SPEAKABLE:  # punctuation, or a script the voice has no sounds for: skipped
                log.info("skipped a sentence the model found nothing to say in: %s", error.message)
                return False
            raise SessionEnd(close_code(error), error) from None
        guard = stream.guard

        async def send(write: Awaitable[None]) -> None:
            # Bounded as a POST's body writes are: a client that reads nothing for --stream-idle-timeout (or
            # past --request-timeout) loses its sentence, and with it the session; one that reads slowly does not.
            try:
                await guard.send(write, self.unsent)
            except LimitExceeded as error:
                log.warning("request %s ended: %s", stream.request_id, error.message)
                stream.code = error.status
                stream.close()
                if error.stalled_write is not None:
                    # Waiting for the connection to take more: nothing of the frame is written yet.
                    error.stalled_write.cancel()
                    await asyncio.gather(error.stalled_write, return_exceptions=True)
                failed = ApiError.from_failure(error)
                raise SessionEnd(close_code(failed), failed, unreachable=True) from None

        try:
            await send(
                self.websocket.send_json(
                    {
                        "type": "audio.start",
                        "sentence": self.spoken,
                        "text": text,
                        "sample_rate": stream.sample_rate,
                        "request_id": stream.request_id,
                    }
                )
            )
            async for piece in stream.pieces():
                await send(self.websocket.send_bytes(piece))
            seconds = stream.samples / stream.encoder.sample_rate
            await send(
                self.websocket.send_json({"type": "audio.done", "sentence": self.spoken, "audio_seconds": seconds})
            )
            return True
        except RequestFailed as error:
            failed = ApiError.from_failure(error)
            raise SessionEnd(close_code(failed), failed) from None
        finally:
            stream.close()  # also on cancel: the request is cancelled in the workers, its slot released
