"""Why an admin command got no answer from a daemon, and what the operator should do about it.

Pure: admin.py dials, probes the address and reads the socket's lock file; this module turns what it saw
into one error. The causes need opposite advice, so they are told apart before any is given: nothing
listens (start a daemon); a process holds the address and sends nothing back (it is starting, wedged or
stopped: wait, or end it); a daemon answers, in another protocol than the one dialled (TLS asked of a
plaintext endpoint or the other way round, or a CA that did not sign its certificate: fix the command's
flags, the daemon is fine). Only the second ever suggests `kill`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from stagevisor.supervisor.addresses import is_unix
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.security.client import ENV_TLS_CA


class Answer(str, enum.Enum):
    """What the admin address sent back to a TLS ClientHello on a raw connection (admin.probe)."""

    NOTHING_LISTENS = "NOTHING_LISTENS"
    """connect() failed: no socket there, or refused."""
    SILENT = "SILENT"
    """Connected, and nothing came back in time: the process is starting, busy, wedged or stopped (SIGSTOP)."""
    CLOSED = "CLOSED"
    """Connected, and closed without a byte (a peer-credential refusal, a connection limit)."""
    PLAINTEXT = "PLAINTEXT"
    """Answered, not with TLS: a plaintext gRPC server sends its HTTP/2 SETTINGS first, which is no TLS record."""
    TLS = "TLS"
    """Completed a TLS handshake (or answered with a TLS alert): the endpoint serves TLS."""
    UNKNOWN = "UNKNOWN"
    """Not probed: an address form the probe does not dial (`dns:///...`, `ipv4:...`)."""


@dataclass(frozen=True)
class Unanswered:
    """What the CLI saw when dialling the admin `address` got no answer within `waited` seconds."""

    address: str
    answer: Answer
    tls_from: tuple[str, ...] = ()
    """The flags or variables that turned TLS on (ClientSecurity.tls_from); empty: dialled in plaintext."""
    holder: int | None = None
    """The pid holding the unix socket's claim (its lock file), when one does."""
    grpc_error: str | None = None
    """gRPC's own reason the connection failed (UNAVAILABLE's details), when it gave one."""
    waited: float = 2.0
    endpoint: str = "admin API"
    """Which of the daemon's endpoints `address` is ("admin API", or "public endpoint" for synthesize), as its log
    names it."""
    unimplemented: bool = False
    """A gRPC server answered the call with UNIMPLEMENTED: it serves other services than this endpoint's."""


def explain(seen: Unanswered) -> StagevisorError:
    """The error to print for `seen`: TLS_MISMATCH when the daemon answers in a protocol the command did not
    dial with (exit 2: the command's flags are wrong), else DAEMON_UNREACHABLE (exit 1)."""
    tls = bool(seen.tls_from)
    if seen.answer is Answer.PLAINTEXT and tls:
        return StagevisorError(ErrorCode.TLS_MISMATCH, _plaintext_daemon(seen))
    if seen.answer is Answer.TLS and not tls:
        return StagevisorError(ErrorCode.TLS_MISMATCH, _tls_daemon(seen))
    if seen.answer is Answer.TLS and seen.grpc_error:
        return StagevisorError(ErrorCode.TLS_MISMATCH, _tls_refused(seen, seen.grpc_error))
    return StagevisorError(ErrorCode.DAEMON_UNREACHABLE, _unreachable(seen))


def _daemon(seen: Unanswered) -> str:
    return f"the stagevisor daemon (pid {seen.holder})" if seen.holder is not None else "the stagevisor daemon"


NOT_HTTP2 = ("Trying to connect an http1.x server", "Failed parsing HTTP/2")
"""What gRPC's connection error says of a server that answered in HTTP/1.x (uvicorn's reply, and one that is
not HTTP/2 framing at all)."""
ENDPOINT_OPTIONS = {"admin API": "--admin-address", "public endpoint": "--address"}
OTHER_ENDPOINTS = {"admin API": "public endpoint (--listen)", "public endpoint": "admin API (--admin-address)"}


def _elsewhere(seen: Unanswered) -> str:
    """Where the endpoint the command wanted is: the address the daemon's log names for it."""
    return (
        f"give {ENDPOINT_OPTIONS.get(seen.endpoint, 'the address')} the address the daemon's log shows as "
        f"`{seen.endpoint} listening on ...`"
    )


def _unreachable(seen: Unanswered) -> str:
    if seen.unimplemented:
        return (
            f"{seen.address} answers gRPC but serves no stagevisor {seen.endpoint} "
            f"({seen.grpc_error or 'UNIMPLEMENTED'}): "
            f"it is another endpoint, such as a daemon's {OTHER_ENDPOINTS.get(seen.endpoint, 'other endpoint')}; "
            f"{_elsewhere(seen)}"
        )
    if seen.grpc_error and any(sign in seen.grpc_error for sign in NOT_HTTP2):
        return (
            f"{seen.address} answers, but not with gRPC (it does not speak HTTP/2): an HTTP/1.x server, such as a "
            f"daemon's HTTP API (--http); {_elsewhere(seen)}"
        )
    if seen.answer in (Answer.PLAINTEXT, Answer.TLS):
        failed = (
            f"the admin call failed ({_reason(seen.grpc_error)})"
            if seen.grpc_error
            else f"gRPC got no answer within {seen.waited:g} s"
        )
        return (
            f"{_daemon(seen)} at {seen.address} answers connections, but {failed}: it is up and may be "
            "overloaded; try again, and see its log"
        )
    if seen.answer is Answer.CLOSED:
        return (
            f"{_daemon(seen)} at {seen.address} closed the connection without answering; its log says why "
            "(on a unix socket it lets in only the uids it allows, see --admin-allow-uid, and at most 64 "
            "admin connections at once)"
        )
    if seen.holder is not None:  # SILENT, or nothing listens yet: the holder is starting, wedged or stopped
        return (
            f"the stagevisor daemon (pid {seen.holder}) that holds {seen.address} does not answer: it is still "
            f"starting, wedged or stopped (SIGSTOP); wait for it, or end it with `kill {seen.holder}` "
            f"(`kill -KILL {seen.holder}` if it stays; its workers exit with it)"
        )
    if seen.answer is Answer.SILENT:
        return (
            f"nothing answers at {seen.address}: a process accepts connections there but sent nothing back "
            f"within {seen.waited:g} s (a daemon still starting, wedged or stopped with SIGSTOP)"
        )
    message = f"no stagevisor daemon at {seen.address}; start one with stagevisor serve"
    if seen.answer is Answer.UNKNOWN and not is_unix(seen.address) and not seen.tls_from:
        message += f" (a daemon serving TLS there needs --tls-ca FILE, --tls or ${ENV_TLS_CA})"
    return message


def _plaintext_daemon(seen: Unanswered) -> str:
    why = (
        " (on a unix socket it always does: the socket's private directory and peer-credential check protect it)"
        if is_unix(seen.address)
        else ""
    )
    return (
        f"{_daemon(seen)} at {seen.address} serves its {seen.endpoint} in plaintext{why}, and this command dialled it "
        f"with TLS ({', '.join(seen.tls_from)}): {_undo(seen.tls_from)}. The daemon is up; its log says "
        f"`{seen.endpoint} listening on {seen.address} (plaintext, ...)`"
    )


def _undo(tls_from: tuple[str, ...]) -> str:
    """`drop --tls-ca and unset STAGEVISOR_TLS_CA` and the like: what turns TLS off again."""
    flags = [source for source in tls_from if source.startswith("--")]
    variables = [name.lstrip("$") for source in tls_from if source.startswith("$") for name in source.split("/")]
    steps = [f"drop {' and '.join(flags)}"] if flags else []
    if variables:
        steps.append(f"unset {' '.join(variables)}")
    return " and ".join(steps)


def _tls_daemon(seen: Unanswered) -> str:
    return (
        f"{_daemon(seen)} at {seen.address} serves its {seen.endpoint} with TLS, and this command dialled it in "
        f"plaintext: give --tls-ca FILE (the CA that signed the daemon's --tls-cert), --tls (when the system CAs "
        f"trust it) or set ${ENV_TLS_CA}. The daemon is up; its log says "
        f"`{seen.endpoint} listening on {seen.address} (TLS, ...)`"
    )


def _tls_refused(seen: Unanswered, grpc_error: str) -> str:
    return (
        f"{_daemon(seen)} at {seen.address} serves TLS, but the connection with this command's TLS settings "
        f"({', '.join(seen.tls_from)}) failed ({_reason(grpc_error)}): give --tls-ca the CA that signed the daemon's "
        "--tls-cert, and --tls-client-cert/--tls-client-key when its log says `(mutual TLS, ...)`. The daemon is up"
    )


def _reason(grpc_error: str) -> str:
    """gRPC's reason without its preamble: `failed to connect to all addresses; last error: UNKNOWN: ADDR: WHY`."""
    _, found, last = grpc_error.partition("last error: ")
    return last if found else grpc_error
