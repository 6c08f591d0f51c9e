"""Typed errors: every failure an operator sees carries a code and names what is involved.

A leaf module: it imports nothing but the standard library, so every layer
(planning, daemon, data plane, admin API, CLI) can share these classes
without import cycles.
"""

from __future__ import annotations

import enum
import time
from typing import Any, Sequence


class ErrorCode(str, enum.Enum):
    """The error codes of the CLI and admin API contract (the CLI contract in README.md)."""

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


class StagevisorError(Exception):
    """Base of every error stagevisor reports to an operator.

    Not recoverable by retrying: the operator fixes the config or the
    command line, as the message says, and runs again.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        stages: Sequence[str] = (),
        edge: tuple[str, str] | None = None,
        gpu: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)
        self.message = message
        self.stages = tuple(stages)
        self.edge = edge
        self.gpu = gpu

    def to_json(self) -> dict[str, Any]:
        """The `{"error": {...}}` object printed by `--format json`."""
        body: dict[str, Any] = {"code": self.code.value, "message": self.message}
        if self.stages:
            body["stages"] = list(self.stages)
        if self.edge is not None:
            body["edge"] = list(self.edge)
        if self.gpu is not None:
            body["gpu"] = self.gpu
        return {"error": body}


class ConfigError(StagevisorError):
    """The YAML file, a stage declaration or a model path is invalid."""


class PlacementError(StagevisorError):
    """A placement request (CLI options or YAML `process` fields) cannot be honoured."""


class DaemonError(Exception):
    """The daemon cannot start or run; the message tells the operator what to change. Exit status 1."""


class WorkerStartError(Exception):
    """A worker did not become READY. `stage` and `traceback` say why when a stage failed to build.

    Recoverable for a restart (the daemon retries with backoff); fatal at daemon startup.
    `time` is when it happened (wall clock), not when the worker was reaped afterwards.
    """

    def __init__(self, group: str, message: str, *, stage: str = "", traceback: str = "") -> None:
        super().__init__(message)
        self.group = group
        self.message = message
        self.stage = stage
        self.traceback = traceback
        self.time = time.time()


class RequestFailed(Exception):
    """A synthesis request ended with an error.

    `status` is a grpc.StatusCode name (the HTTP API maps it to a status code);
    `message` is safe to show the client. Recoverable: the client may retry.
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
