"""The CLI's client of a daemon's admin API: the options every admin command takes, a bounded connection, and
what an unreachable daemon or a placement refusal prints.

When nothing answers, `probe` asks the address what protocol it speaks (if any) and `unanswered.explain` says
why: a daemon serving plaintext to a TLS dial (or the other way round) is a TLS_MISMATCH, never "wedged".

The admin commands, by concern: `views.py` (topology, status, events), `workers.py` (restart, scale),
`apply.py`, `stop.py`; `report_text.py` writes their tables. grpc is imported inside the functions:
`stagevisor plan` imports every command module to build the parser and must not pay for (or depend on) grpc.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from stagevisor.supervisor.addresses import default_admin_address, dial_address, host_port, unix_path
from stagevisor.supervisor.commands.output_format import add_format_option
from stagevisor.supervisor.commands.unanswered import Answer, Unanswered, explain
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.security.client import add_client_options, check_admin_socket, client_security

CONNECT_TIMEOUT = 2.0
FAIL_FAST_TIMEOUT = 0.25
"""How long the call that asks gRPC why it did not connect may wait (it fails at once when gRPC knows)."""
EXIT_UNREACHABLE = 1


class Unreachable(Exception):
    """No daemon answered at the admin address; `grpc_error` is gRPC's reason, when it gave one."""

    def __init__(
        self, address: str, grpc_error: str | None = None, *, unimplemented: bool = False, lost: bool = False
    ) -> None:
        super().__init__(address)
        self.address = address
        self.grpc_error = grpc_error
        self.unimplemented = unimplemented
        """A gRPC server answered without the admin API (UNIMPLEMENTED): the address is another endpoint."""
        self.lost = lost
        """The daemon was reached, then the connection ended under the call (it stopped, crashed or restarted)."""


def add_admin_options(parser: argparse.ArgumentParser, *, formats: bool = False) -> None:
    """--admin-address and the client's credentials (and --format, with `formats`): what every admin command takes."""
    parser.add_argument(
        "--admin-address",
        metavar="ADDRESS",
        type=dial_address,
        default=default_admin_address(),
        help="the daemon's admin endpoint (default %(default)s)",
    )
    if formats:
        add_format_option(parser)
    add_client_options(parser)


def call(args: argparse.Namespace, method: Callable[[Any], Any]) -> Any:
    """Connect to `args.admin_address` (bounded), then run `method(stub)`; Unreachable when no daemon answers."""
    import grpc

    from stagevisor.supervisor._proto import admin_pb2_grpc

    address = args.admin_address
    path = unix_path(address)
    if path is not None and not path.exists():
        raise Unreachable(address)
    check_admin_socket(address)  # before a byte or the token goes to a socket another user may control
    with client_security(args).channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
        except grpc.FutureTimeoutError:
            raise Unreachable(address, _connect_error(channel)) from None
        try:
            return method(admin_pb2_grpc.AdminStub(channel))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:  # connected above: it went away under the call
                raise Unreachable(address, error.details(), lost=True) from None
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Unreachable(address, f"UNIMPLEMENTED: {error.details()}", unimplemented=True) from None
            raise


def _connect_error(channel: Any) -> str | None:
    """gRPC's reason the channel did not connect: a call that does not wait for a connection fails at once with
    the last connection error (UNAVAILABLE); None while it is still connecting (nothing answered)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=FAIL_FAST_TIMEOUT, wait_for_ready=False
        )
    except grpc.RpcError as error:
        return str(error.details()) if error.code() == grpc.StatusCode.UNAVAILABLE else None
    return None


def probe(address: str, timeout: float | None = None) -> Answer:
    """What the admin `address` sends back to a TLS ClientHello on a connection of its own: the one question
    that tells a TLS daemon from a plaintext one (which sends its HTTP/2 SETTINGS first) from a silent one.

    Nothing secret is sent (the certificate is not checked: trusting it is gRPC's part), and a unix address was
    already checked by `check_admin_socket`. `timeout`: seconds to connect and to wait for an answer
    (default CONNECT_TIMEOUT).
    """
    import socket
    import ssl

    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    path = unix_path(address)
    try:
        if path is not None or address.startswith("unix-abstract:"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                sock.connect(str(path) if path is not None else "\0" + address[len("unix-abstract:") :])
            except OSError:
                sock.close()
                raise
        else:
            target = _tcp_target(address)
            if target is None:
                return Answer.UNKNOWN
            sock = socket.create_connection(target, timeout=timeout)
    except OSError:
        return Answer.NOTHING_LISTENS
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with context.wrap_socket(sock):
            return Answer.TLS
    except TimeoutError:
        return Answer.SILENT
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return Answer.CLOSED
    except ssl.SSLError as error:  # a TLS alert is a TLS peer refusing this hello; anything else is not TLS
        return Answer.TLS if "ALERT" in str(error.reason or "") else Answer.PLAINTEXT
    except OSError:  # reset or broken pipe: closed before answering
        return Answer.CLOSED
    finally:
        sock.close()


def tls_mismatch(address: str, tls_from: tuple[str, ...], grpc_error: str | None) -> StagevisorError | None:
    """TLS_MISMATCH when the daemon's public endpoint at `address` answers in the other protocol than the one
    dialled (a probe of its own connection, as the admin commands make); None otherwise."""
    from stagevisor.supervisor.commands.unanswered import Unanswered, explain

    seen = Unanswered(address, probe(address), tls_from, grpc_error=grpc_error, endpoint="public endpoint")
    error = explain(seen)
    return error if error.code is ErrorCode.TLS_MISMATCH else None


def _tcp_target(address: str) -> tuple[str, int] | None:
    """(host, port) of a plain `HOST:PORT` or `[v6]:PORT` address; None for gRPC's other forms (`dns:///...`)."""
    import ipaddress

    found = host_port(address)
    if found is None:
        return None
    host, port = found
    if "/" in host or ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    return host, port


def unreachable_error(args: argparse.Namespace, unreachable: Unreachable) -> StagevisorError:
    """Why nothing answered at the admin address, and what to do (unanswered.explain): from the socket's lock
    file (who holds it), a probe of the address (what protocol answers, if any) and gRPC's own reason."""
    from stagevisor.supervisor.daemon.runtime_files import claim_holder

    if unreachable.lost:  # not "no daemon ...; start one": one answered, and `events` may have followed it for hours
        return StagevisorError(
            ErrorCode.DAEMON_UNREACHABLE,
            f"lost the connection to the daemon at {unreachable.address} ({unreachable.grpc_error}): it stopped or "
            "restarted; `stagevisor status` says whether one serves there now",
        )
    address = args.admin_address
    path = unix_path(address)
    seen = Unanswered(
        address=address,
        answer=probe(address),
        tls_from=client_security(args).tls_from,
        holder=claim_holder(path) if path is not None else None,
        grpc_error=unreachable.grpc_error,
        waited=CONNECT_TIMEOUT,
        unimplemented=unreachable.unimplemented,
    )
    return explain(seen)


def report_unreachable(args: argparse.Namespace, unreachable: Unreachable) -> int:
    """Print why no daemon answered (one line; the error object too with --format json) and return exit status 1.

    A daemon that answers in another protocol than the command dialled is the command's error, not the daemon's:
    that StagevisorError (TLS_MISMATCH) is raised, and the CLI reports it as a usage error (exit 2).
    """
    error = unreachable_error(args, unreachable)
    if error.code is not ErrorCode.DAEMON_UNREACHABLE:
        raise error
    print(f"error: {error.message}", file=sys.stderr)
    if args.format == "json":  # a script reading stdout gets the error, not nothing
        print(json.dumps(error.to_json()))
    return EXIT_UNREACHABLE


def run(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run an admin command's `body`; an unreachable daemon or a gRPC error becomes one line and its exit status."""
    import grpc

    client_security(args)  # a missing or bad --api-key-file / --tls-ca is a usage error (exit 2), not "unreachable"
    try:
        return body()
    except Unreachable as unreachable:
        return report_unreachable(args, unreachable)
    except grpc.RpcError as error:
        return report_refusal(args, error)


def report_refusal(args: argparse.Namespace, error: Any) -> int:
    """A command the daemon answered but did not carry out: its message on stderr, with --format json the error
    object on stdout too (DAEMON_REFUSED), as for an unreachable daemon; exit status 1."""
    print(f"error: {error.details()}", file=sys.stderr)
    if args.format == "json":  # a script reading stdout gets the error, not nothing
        print(json.dumps(StagevisorError(ErrorCode.DAEMON_REFUSED, error.details() or "").to_json()))
    return 1


def placement_refusal(error: Any) -> StagevisorError | None:
    """The placement error a daemon refused a scale or an apply with (FAILED_PRECONDITION `CODE: message`), or None."""
    import grpc

    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    code, _, detail = (error.details() or "").partition(": ")
    if not detail or code not in ErrorCode.__members__:
        return None
    return StagevisorError(ErrorCode[code], detail)
