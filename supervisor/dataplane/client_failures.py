"""What a client learns when its request fails: a stage's failure, sanitized and bounded, or which worker went away.

The rule (stages/README.md): a StageError's text (InvalidRequest's too) is written for the client and reaches
it; of any other exception the client learns the class and its text stays in the daemon log.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Sequence

from stagevisor.stages.base import is_error_code, is_field_name
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.errors import UNEXPECTED_ADVICE, clipped

_FAILURE_STATUS = {
    pb.FAILURE_CODE_INTERNAL: "INTERNAL",
    pb.FAILURE_CODE_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    pb.FAILURE_CODE_UNAVAILABLE: "UNAVAILABLE",
}


STAGE_FAILURE_LOGGED = "request %s failed in stage %r%s: %s"
"""The log line of a stage's unexpected failure: request id, stage, ` (ExceptionClass)` or "", the stage's own
words. Clients get only the class and the id; `stagevisor check --verify-edges` reads the words back from here."""
MAX_ECHOED_CHARS = 300
"""Longest text from a stage (a StageError's or InvalidRequest's message) passed on to a public client."""
MAX_ERROR_TYPE_CHARS = 60
"""Longest exception class name passed on: the message keeps room for the request id in a WebSocket close reason."""


def client_text(text: str, limit: int = MAX_ECHOED_CHARS) -> str:
    """A stage's text as a client may see it: control and format characters (newlines, escapes,
    bidirectional overrides) become spaces, runs of spaces one, and the result is cut to `limit`."""
    printable = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    return clipped(" ".join(printable.split()), limit)


def public_failure(failure: Any) -> tuple[str, str]:
    """(grpc status name, client message) for a worker's Failure.

    The rule (stages/README.md): a StageError's text (InvalidRequest's too) is written for the client and
    reaches it, sanitized and bounded; of any other exception the client learns the class, its text stays
    in the daemon log.
    """
    status = _FAILURE_STATUS.get(failure.code, "INTERNAL")
    where = f"stage {failure.stage!r}" if failure.stage else "a stage"
    written = client_text(failure.client_message)
    if status == "INVALID_ARGUMENT":  # the executor's own InvalidRequest
        return status, f"{where} rejected the request: {written or client_text(failure.message)}"
    if status == "UNAVAILABLE":
        return status, client_text(failure.message)
    if written:  # a StageError
        return status, f"{where} failed: {written}"
    kind = client_text(failure.error_type[:MAX_ERROR_TYPE_CHARS])
    return status, f"{where} failed{f' with {kind}' if kind else ''}; {UNEXPECTED_ADVICE}"


def public_code(failure: Any) -> str:
    """The code a client gets beside the status of a worker's Failure: the StageError's own `code`, or "" when it
    gave none or the frame carries anything but such a code (a worker is trusted no further than its text)."""
    code = failure.client_code
    return code if is_error_code(code) else ""


def public_field(failure: Any) -> str:
    """The request field a client is told a worker's Failure is about: the StageError's own `field`, or "" when it
    named none or the frame carries anything but a field name."""
    field = failure.client_field
    return field if is_field_name(field) else ""


def _stages_are(stages: Sequence[str]) -> str:
    """`stage 'a' is` or `stages 'a', 'b' are`: a process group that holds several stages takes them all down."""
    if len(stages) > 1:
        return f"stages {', '.join(map(repr, stages))} are"
    return f"stage {', '.join(map(repr, stages)) or '(unknown)'} is"


PROCESS_STOPPED = "the process is stopped (SIGSTOP, SIGTSTP or a debugger)"
"""Why a worker that missed its heartbeat did, when the kernel says it is stopped: in the runner's reason."""


OUTLASTED_STOP_TIMEOUT = "was still running when its stop timeout ran out"
"""Why the daemon killed a worker it had asked to stop (SIGTERM): in the runner's reason. Not that it ignored
SIGTERM: it may have drained its requests, or closed, for longer than the stop timeout."""


def group_down(stages: Sequence[str], group: str, reason: str) -> str:
    """UNAVAILABLE for requests through `stages` when their worker (process group `group`) ended for `reason`."""
    # `reason` (pid, exit status) is for the operator; the runner has logged it.
    went = "went down"
    if OUTLASTED_STOP_TIMEOUT in reason:
        went = "was stopped (a restart, a scale-down or a shutdown) and killed when it outlasted the stop timeout"
    elif "heartbeat" in reason:
        cause = "its process was stopped" if PROCESS_STOPPED in reason else "its event loop was blocked"
        went = f"stopped answering its heartbeat ({cause}) and was killed"
    return f"{_stages_are(stages)} unavailable: its worker (group {group!r}) {went}; retry"


def replica_down(stages: Sequence[str]) -> str:
    """UNAVAILABLE for requests sent to a replica (holding `stages`) whose worker died."""
    held = "them" if len(stages) > 1 else "it"
    return f"{_stages_are(stages)} unavailable: the replica that held {held} went down; retry"


def worker_stopped(stages: Sequence[str]) -> str:
    """UNAVAILABLE for requests a worker (holding `stages`) still held, or was sent, when it stopped on purpose: a
    restart, a scale-down or a shutdown ended its drain before them."""
    return (
        f"{_stages_are(stages)} unavailable: its worker stopped (a restart, a "
        "scale-down or a shutdown) before this request ended; retry"
    )


def worker_unreachable(stages: Sequence[str], groups: Sequence[str], out_of_descriptors: bool) -> str:
    """UNAVAILABLE for requests whose link to the worker holding `stages` (groups `groups`, where known) broke.

    `out_of_descriptors`: the worker is fine, this daemon could not open a socket to it.
    """
    if out_of_descriptors:
        return (
            f"{_stages_are(stages)} unreachable: the daemon is out of file "
            "descriptors; retry later, and have the operator raise its limit (ulimit -n, LimitNOFILE=)"
        )
    group = f" (group {', '.join(map(repr, groups))})" if groups else ""  # a worker's sender knows stages only
    return f"{_stages_are(stages)} unavailable: its worker{group} became unreachable; retry"
