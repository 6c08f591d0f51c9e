"""Typed errors: every failure an operator sees carries a code and names what is involved.

A leaf module: it imports nothing but the standard library, so every layer
(planning, daemon, data plane, admin API, CLI) can share these classes
without import cycles.
"""

from __future__ import annotations

import enum
import reprlib
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

MAX_SHOWN_CHARS = 120
"""Longest rendering of a received value inside an error message."""
MAX_MESSAGE_CHARS = 2000
"""Longest error message: whatever it echoes, one error is one readable line, not megabytes."""


def clipped(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def shown(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """repr(value) for an error message, bounded in length and in time whatever the value.

    A YAML alias bomb expands to a structure whose full repr is hundreds of
    megabytes: only a few items per container and a few levels are rendered.
    """
    short = reprlib.Repr()
    short.maxlevel = 3
    short.maxlist = short.maxtuple = short.maxset = short.maxfrozenset = short.maxdict = 4
    short.maxstring = short.maxother = short.maxlong = limit
    return clipped(short.repr(value), limit)


class ErrorCode(str, enum.Enum):
    """The error codes of the CLI and admin API contract (docs/placement.md, "Errors"; docs/reference/cli.md)."""

    INVALID_CONFIG = "INVALID_CONFIG"
    UNKNOWN_MODEL = "UNKNOWN_MODEL"
    UNKNOWN_STAGE = "UNKNOWN_STAGE"
    MALFORMED_ASSIGNMENT = "MALFORMED_ASSIGNMENT"
    DUPLICATE_ASSIGNMENT = "DUPLICATE_ASSIGNMENT"
    TP_STAGE = "TP_STAGE"
    UNSAFE_EDGE = "UNSAFE_EDGE"
    MISSING_FRACTION = "MISSING_FRACTION"
    OVER_LIMIT = "OVER_LIMIT"
    CONFLICTING_RECOMMENDATION = "CONFLICTING_RECOMMENDATION"
    GROUP_SPANS_GPUS = "GROUP_SPANS_GPUS"
    NAME_COLLISION = "NAME_COLLISION"
    MISSING_PROCESS = "MISSING_PROCESS"
    RUNTIME_FRACTION_MISMATCH = "RUNTIME_FRACTION_MISMATCH"
    INSECURE_ENDPOINT = "INSECURE_ENDPOINT"
    """An endpoint would be exposed without the TLS or token it needs (serve refuses to start)."""
    CLUSTER_LACKS = "CLUSTER_LACKS"
    """The Ray cluster of `--launcher ray` lacks a node or GPUs the plan needs (nothing was started)."""
    STAND_IN_NOT_REQUESTED = "STAND_IN_NOT_REQUESTED"
    """The model's stages would run stand-in executors (not its weights) and `--stand-ins` was not given."""
    CLUSTER_UNREACHABLE = "CLUSTER_UNREACHABLE"
    """`--launcher ray` cannot join the cluster of --ray-address, or Ray (`stagevisor[ray]`) is not installed."""
    OUTSIDE_AUTOSCALE_BOUNDS = "OUTSIDE_AUTOSCALE_BOUNDS"
    """`scale` asked an autoscaled group for a count outside its bounds, which the autoscaler would undo at once."""
    DAEMON_REFUSED = "DAEMON_REFUSED"
    """The daemon answered but did not carry a command out: it is stopping or degraded, or the change failed (a new
    worker did not start); the message says which and what to do (exit status 1)."""
    DAEMON_UNREACHABLE = "DAEMON_UNREACHABLE"
    """No daemon answers at the admin address a command dialled (exit status 1, not 2: nothing was wrong with it)."""
    TLS_MISMATCH = "TLS_MISMATCH"
    """A daemon answers at the admin address, but not over the command's TLS settings: TLS dialled to its plaintext
    endpoint (a unix socket always is), plaintext to its TLS one, or a CA that did not sign its certificate (exit
    status 2: the command's flags are wrong; the daemon is up)."""
    MODULE_NOT_FOUND = "MODULE_NOT_FOUND"
    """A stage's factory module is not on the import path: a typo in `module:callable`, or no --app-dir."""
    MISSING_DEPENDENCY = "MISSING_DEPENDENCY"
    """A stage's factory module was found, but importing it (or calling its factory) failed on an import of its own;
    or, before any worker starts, the optional extra its executors need is not installed."""
    MISSING_REQUIREMENT = "MISSING_REQUIREMENT"
    """Before any worker starts: the model lacks what its declaration needs here beyond an extra (a checkpoint not
    found); the message names it and what to do."""


KeyPath = tuple[str | int | float | None, ...]
"""Where a value sits in a config document: its mapping keys and sequence indexes from the top. A key is as YAML
read it: a string mostly, but `null:` is None, `1:` and `true:` ints (a bool), `1.5:` a float."""


@dataclass(frozen=True)
class SourceLocation:
    """Where an entry of a config file is written: the file, and its 1-based line and column."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column}


@dataclass(frozen=True)
class Problem:
    """One of the problems an error lists (a schema error names up to three): the field, what is wrong with
    it, and where it is written when the file is known."""

    field: str
    message: str
    location: SourceLocation | None = None

    def __str__(self) -> str:
        clause = f"{self.field}: {self.message}" if self.field else self.message
        return f"{self.location}: {clause}" if self.location is not None else clause

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"field": self.field, "message": self.message}
        if self.location is not None:
            body.update(self.location.to_json())
        return body


class StagevisorError(Exception):
    """Base of every error stagevisor reports to an operator.

    Not recoverable by retrying: the operator fixes the config or the
    command line, as the message says, and runs again.

    `config_path` is the config entry the error is about (`("stages", 2, "stream_to", 0)`), where one is;
    planning sets it without knowing any file. `location` is where that entry is written, attached by
    whoever holds the file's locations (see `at`); the message then starts with it. `problems` are the
    problems the message lists, where it lists several.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        stages: Sequence[str] = (),
        edge: tuple[str, str] | None = None,
        gpu: int | None = None,
        config_path: KeyPath = (),
        location: SourceLocation | None = None,
        problems: Sequence[Problem] = (),
    ) -> None:
        message = clipped(message)
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.stages = tuple(stages)
        self.edge = edge
        self.gpu = gpu
        self.config_path = tuple(config_path)
        self.location = location
        self.problems = tuple(problems)

    def _copy(self, message: str, config_path: KeyPath, location: SourceLocation | None) -> "StagevisorError":
        return type(self)(
            self.code,
            message,
            stages=self.stages,
            edge=self.edge,
            gpu=self.gpu,
            config_path=config_path,
            location=location,
            problems=self.problems,
        )

    def adding(self, advice: str) -> "StagevisorError":
        """This error with `advice` after its message (what the caller knows that the rule that raised it did not)."""
        return self._copy(f"{self.message}{advice}", self.config_path, self.location)

    def about(self, config_path: KeyPath) -> "StagevisorError":
        """This error naming another config entry (or, with `()`, none: the cause was not in the file)."""
        return self._copy(self.message, config_path, self.location)

    def at(self, location: SourceLocation) -> "StagevisorError":
        """This error located in its file: `file:line:column: ` replaces the leading `file: ` of the message."""
        message = self.message.removeprefix(f"{location.file}: ")
        return self._copy(f"{location}: {message}", self.config_path, location)

    def to_json(self) -> dict[str, Any]:
        """The `{"error": {...}}` object printed by `--format json`."""
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.stages:
            body["stages"] = list(self.stages)
        if self.edge is not None:
            body["edge"] = list(self.edge)
        if self.gpu is not None:
            body["gpu"] = self.gpu
        if self.location is not None:
            body.update(self.location.to_json())
        if len(self.problems) > 1:
            body["problems"] = [problem.to_json() for problem in self.problems]
        return {"error": body}


class ConfigError(StagevisorError):
    """The YAML file, a stage declaration or a model path is invalid."""


class PlacementError(StagevisorError):
    """A placement request (CLI options or YAML `process` fields) cannot be honoured."""


class DaemonErrorCode(str, enum.Enum):
    """Why `stagevisor serve` cannot start or run (exit status 1)."""

    DAEMON_ERROR = "DAEMON_ERROR"
    """Any other reason; the message says which and what to change."""
    ADDRESS_IN_USE = "ADDRESS_IN_USE"
    """Another process listens on the address (a second daemon, or another program)."""
    DAEMON_RUNNING = "DAEMON_RUNNING"
    """A live daemon holds the admin socket."""
    UNSAFE_PATH = "UNSAFE_PATH"
    """A runtime directory, socket or lock path is a symbolic link, of the wrong kind, or another user's."""
    STARTUP_FAILED = "STARTUP_FAILED"
    """A worker failed to start at daemon startup (StartupError): the message names its group and the root cause."""


class DaemonError(Exception):
    """The daemon cannot start or run; the message tells the operator what to change. Exit status 1.

    Not recoverable by retrying as is: the operator frees the address, removes
    the offending file or fixes the stage, then starts again.
    """

    def __init__(self, message: str, *, code: DaemonErrorCode | ErrorCode = DaemonErrorCode.DAEMON_ERROR) -> None:
        """`code` an ErrorCode where a coded check stops the daemon after it started (e.g. CLUSTER_LACKS when the
        Ray cluster it joins lacks a node), so `serve` prints that code, as `plan` would."""
        super().__init__(message)
        self.code = code if isinstance(code, ErrorCode) else DaemonErrorCode(code)
        self.message = message


RETRIED_ADVICE = "it is retried with backoff, see `stagevisor status`"
"""What happens after a worker fails to start on a restart, unless the error says otherwise."""


class WorkerStartError(Exception):
    """A worker did not become READY. `stage` and `traceback` say why when a stage failed to build.

    Recoverable for a restart (the daemon retries with backoff); fatal at daemon startup.
    `time` is when it happened (wall clock), not when the worker was reaped afterwards.
    """

    def __init__(
        self, group: str, message: str, *, stage: str = "", traceback: str = "", advice: str = RETRIED_ADVICE
    ) -> None:
        super().__init__(message)
        self.group = group
        self.message = message
        self.stage = stage
        self.traceback = traceback
        self.advice = advice
        """What happens to the group now, for the operator who asked for the restart."""
        self.time = time.time()


class StoppedWhileStarting(WorkerStartError):
    """A group's new worker was stopped before its handshake ended: the daemon is stopping, or an apply replaced
    the group. Nothing is retried, and whatever served before may be stopping too."""

    def __init__(self, group: str) -> None:
        super().__init__(
            group,
            "the group was stopped while its new worker started (the daemon is stopping, or an apply replaced "
            "the group)",
            advice="`stagevisor status` shows what runs now",
        )


class RequestFailed(Exception):
    """A synthesis request ended with an error.

    `status` is a grpc.StatusCode name (the HTTP API maps it to a status code);
    `message` is safe to show the client: it never carries an executor's
    exception text (which may hold secrets; that goes to the daemon log under
    `request_id`). `stage` is the failing stage where one is known. `code`,
    where set, names the failure more precisely than its status does: a
    stage's own (StageError's `code`, UPPER_SNAKE; the HTTP API reports it as
    the error's code and gRPC in trailing metadata) or the daemon's
    (`audio_limit_exceeded`, HTTP's alone). `field`, where set, is the request
    field the failure is about, as the request names it (StageError's `field`:
    `voice`, an option's key; gRPC's trailing metadata, the HTTP error's
    `param`). `retry_after`, where set, is how many
    seconds the client should wait before it retries (HTTP's Retry-After, gRPC's
    `grpc-retry-pushback-ms` trailer): an UNAVAILABLE failure's while a worker
    on its route is restarted.
    Recoverable: the client may retry.
    """

    def __init__(
        self,
        status: str,
        message: str,
        *,
        stage: str = "",
        request_id: str = "",
        code: str = "",
        field: str = "",
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.stage = stage
        self.request_id = request_id
        self.code = code
        self.field = field
        self.retry_after = retry_after

    def public_message(self) -> str:
        """`message` with the request id an operator can look up in the daemon log."""
        return f"{self.message} (request {self.request_id})" if self.request_id else self.message


UNEXPECTED_ADVICE = "the daemon log has the details"
"""What a client's message for an unexpected exception says where the cause is (under the request id it ends with)."""


def unexpected_failure(error: BaseException, request_id: str = "") -> RequestFailed:
    """INTERNAL for an unexpected exception in the daemon itself: its class and a request id, never its text.

    The text may hold paths, hostnames or secrets; the caller logs it, with its
    traceback, under the same id. A request that has no id yet gets a fresh one.
    """
    return RequestFailed(
        "INTERNAL",
        f"the daemon failed with {type(error).__name__}; {UNEXPECTED_ADVICE}",
        request_id=request_id or uuid.uuid4().hex,
    )
