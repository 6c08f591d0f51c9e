"""The Stage contract: how an executor receives a StagePayload, emits results and streams chunks."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Protocol, TypeGuard, runtime_checkable


DEFAULT_MAX_TEXT_CHARS = 5000
"""Longest text a request may carry unless a stage declares less (its `max_text_chars` attribute)."""
MAX_ERROR_CODE_CHARS = 64
"""Longest `code` a StageError may carry: UPPER_SNAKE, a letter then letters, digits and underscores."""
_ERROR_CODE = re.compile(rf"[A-Z][A-Z0-9_]{{0,{MAX_ERROR_CODE_CHARS - 1}}}")
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""A request field's name, as a StageError's `field` gives it: the form of an option's key (at most 64 characters)."""


@dataclass
class StagePayload:
    """What travels along an edge for one request.

    `request` is the client's synthesis request (text, voice, reference audio,
    transcript, options) and never changes along the pipeline. `data` is a tree
    of scalars, strings, bytes, lists, dicts and tensors (numpy arrays, torch
    tensors where torch is present) that each stage hands to the next.
    """

    request_id: str
    request: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)


class StageError(Exception):
    """Raised by an executor to fail one request with a message written for the client.

    Recoverable: only that request ends; the stage keeps serving others. The
    message reaches the client (sanitized and cut to 300 characters), so it must
    hold nothing secret. Any other exception also ends only its request, but
    its text stays in the daemon log and the client gets a generic message
    naming its class and the request id (stages/README.md, "Errors: what the
    client sees").

    `code`, optional, names the reason for a program to match on
    (`QWEN3_UNKNOWN_SPEAKER`): a letter, then up to 63 upper-case letters,
    digits and underscores (`is_error_code`). It reaches the client beside the
    status: gRPC's trailing metadata `stagevisor-error-code`, the HTTP error's
    `code`. Anything else is a ValueError here, when the stage raises it. A
    subclass may name its code as a class attribute instead (`code =
    "MYMODEL_UNKNOWN_VOICE"`); the worker passes on only a valid one.

    `field`, optional, names the one request field the refusal is about, as
    the request names it (`voice`, `instructions`, `language`, `seed`,
    `reference_audio`, `reference_transcript`, an option's key): gRPC's
    trailing metadata `stagevisor-error-field`, the HTTP error's `param` (in
    the HTTP API's own name for it: `ref_audio` for `reference_audio`). A name
    not in an option key's form (`is_field_name`) is dropped, not raised: it is
    often the client's own text (an unknown option's key), and a refusal must
    stay a refusal, whatever the key, where no gateway checked it first
    (`stagevisor check --option`).
    """

    code: str | None = None
    field: str | None = None

    def __init__(self, *args: object, code: str | None = None, field: str | None = None) -> None:
        super().__init__(*args)
        if is_field_name(field):
            self.field = field
        if code is None:
            return  # a subclass's own `code`, if it has one, stays
        if not is_error_code(code):
            raise ValueError(
                f"a StageError's code must be a letter then up to {MAX_ERROR_CODE_CHARS - 1} of A-Z, 0-9 and _ "
                f"(UPPER_SNAKE, e.g. 'MYMODEL_UNKNOWN_VOICE'), got {code!r}"
            )
        self.code = code


def is_error_code(value: object) -> TypeGuard[str]:
    """Whether `value` is a code a StageError may carry, and one a client is passed: anything else is dropped."""
    return isinstance(value, str) and _ERROR_CODE.fullmatch(value) is not None


def is_field_name(value: object) -> TypeGuard[str]:
    """Whether `value` is a field name a StageError may carry, and one a client is passed: anything else is dropped."""
    return isinstance(value, str) and _FIELD_NAME.fullmatch(value) is not None


class StageContext(Protocol):
    """Per-request handle an executor receives next to its payload.

    Valid only while `process` runs: the runtime reuses it for the next
    in-process stage, so do not keep it in a background task.
    """

    @property
    def request_id(self) -> str: ...

    @property
    def cancelled(self) -> bool:
        """True once the client cancelled or the request failed elsewhere; stop working."""

    async def stream(self, chunk: Any) -> None:
        """Send one ordered chunk to every `stream_to` stage (to the client for a terminal stage).

        Awaiting it is the backpressure: a slow consumer slows its producer. Never call it once `process`
        has returned (from a task it left running): where the stream crosses to another process it raises
        RuntimeError, but within a chain of direct calls the context is already the next stage's, and the
        chunk would go out as that stage's (refusing it there would cost every in-process hop a check).
        """

    def chunks(self) -> AsyncIterator[Any]:
        """Chunks streamed to this stage by its upstream, in order, ending at the end marker.

        Empty when the upstream edge is not a `stream_to` edge. When it ends,
        `payload.data` holds the upstream's final data.
        """


@runtime_checkable
class Stage(Protocol):
    """An executor for one pipeline stage, built once per worker by its factory.

    `process` is called once per request. A stage that is a `stream_to` target
    is called as soon as its upstream opens the stream (its first chunk), with
    an empty `payload.data` that is filled with the upstream's final data when
    `ctx.chunks()` ends; other stages are called with the upstream's final
    payload. The returned dict becomes `data` of the payload handed to every
    `next` stage (None means an empty dict). Raise StageError to fail the
    request with a message for the client, and with `code=` a machine-readable
    reason beside it (StageError says which codes are valid). Heavy
    synchronous compute belongs in `asyncio.to_thread` so one worker keeps
    serving its other stages and requests.

    An executor that handles text may declare `max_text_chars` (an int
    attribute): the longest text it accepts. The worker reports it when it
    becomes READY and the daemon's gateway refuses longer texts with
    INVALID_ARGUMENT before any stage sees them; the smallest declaration on
    the pipeline wins, and DEFAULT_MAX_TEXT_CHARS applies when none declares.
    Anything but a positive int there fails the stage's build.

    It may also declare `voices` (a list of dicts, each with a string `id`):
    the worker reports them when it becomes READY, `GET /v1/audio/voices`
    lists them and the HTTP API refuses other voice names. A list with an
    entry that is not such a dict is ignored whole, with a warning in the log.
    """

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None: ...


class InvalidRequest(StageError):
    """Raised when the request itself is invalid (bad option, unusable reference audio).

    The client receives INVALID_ARGUMENT with this message, and the `code` if
    one is given; retrying the same request cannot succeed.
    """


NOTHING_SPEAKABLE = "NOTHING_SPEAKABLE"
"""The code of an InvalidRequest for a text with no sound in it (punctuation alone, a script the voice cannot
read): a streaming client's session (the WebSocket) skips such a sentence rather than end on it."""


def max_text_chars_declared_by(executor: object) -> object:
    """What `executor` declares as its `max_text_chars` (see Stage), as it stands; None when it declares nothing.

    The one place that reads this optional declaration by name: an executor is
    foreign code, so its value is checked by each reader (usable_max_text_chars).
    """
    return getattr(executor, "max_text_chars", None)


def voices_declared_by(executor: object) -> object:
    """What `executor` declares as its `voices` (see Stage), as it stands; None when it declares nothing.

    The one place that reads this optional declaration by name; the worker
    checks the value before it reports it (worker/build.py, declared_voices).
    """
    return getattr(executor, "voices", None)


def usable_max_text_chars(value: object) -> TypeGuard[int]:
    """Whether a `max_text_chars` declaration is a positive int (a bool is not), the only form the contract accepts."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def declared_max_text_chars(executors: Iterable[Any]) -> int | None:
    """The smallest `max_text_chars` the executors declare, None when none declares one."""
    declared = []
    for executor in executors:
        value = max_text_chars_declared_by(executor)
        if usable_max_text_chars(value):
            declared.append(value)
    return min(declared, default=None)


def selects_voice(requested: str, names: Iterable[str]) -> bool:
    """Whether a request's `voice` names one of `names`, whitespace around it and case aside: as the HTTP API
    matches the model's voices (`HEART` is `heart`), so that gRPC, the CLI and HTTP accept the same names."""
    wanted = requested.strip().casefold()
    return any(wanted == name.casefold() for name in names)
