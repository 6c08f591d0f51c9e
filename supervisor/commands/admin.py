"""The CLI's client of a daemon's admin API: the options every admin command takes, a bounded connection, and
what an unreachable daemon or a placement refusal prints.

The admin commands, by concern: `views.py` (topology, status, events), `workers.py` (restart, scale),
`apply.py`, `stop.py`; `report_text.py` writes their tables. grpc is imported inside the functions:
`stagevisor plan` imports every command module to build the parser and must not pay for (or depend on) grpc.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from stagevisor.supervisor.addresses import default_admin_address, dial_address
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.security import ENV_TLS_CA, add_client_options, check_admin_socket, client_security

CONNECT_TIMEOUT = 2.0
EXIT_UNREACHABLE = 1


class Unreachable(Exception):
    """No daemon answered at the admin address."""


def add_admin_options(parser: argparse.ArgumentParser, *, formats: bool = False) -> None:
    """--admin-address and the client's credentials (and --format, with `formats`): what every admin command takes."""
    parser.add_argument(
        "--admin-address",
        type=dial_address,
        default=default_admin_address(),
        help="the daemon's admin endpoint (default %(default)s)",
    )
    if formats:
        parser.add_argument(
            "--format", choices=["table", "json"], default="table", help="output format (default: table)"
        )
    add_client_options(parser)


def call(args: argparse.Namespace, method: Callable[[Any], Any]) -> Any:
    """Connect to `args.admin_address` (bounded), then run `method(stub)`; Unreachable when no daemon answers."""
    import grpc

    from stagevisor.supervisor._proto import admin_pb2_grpc
    from stagevisor.supervisor.admin.servicer import unix_path

    address = args.admin_address
    path = unix_path(address)
    if path is not None and not path.exists():
        raise Unreachable(address)
    check_admin_socket(address)  # before a byte or the token goes to a socket another user may control
    with client_security(args).channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
        except grpc.FutureTimeoutError:
            raise Unreachable(address) from None
        try:
            return method(admin_pb2_grpc.AdminStub(channel))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unreachable(address) from None
            raise


def unreachable_message(address: str) -> str:
    """Why nothing answered at the admin `address`, and what to do: start a daemon, or deal with the one that holds
    the socket without answering (its pid is in the socket's lock file), which `serve` would refuse to replace."""
    from stagevisor.supervisor.admin.servicer import unix_path
    from stagevisor.supervisor.daemon.runtime_files import claim_holder

    path = unix_path(address)
    holder = claim_holder(path) if path is not None else None
    if holder is None:
        return f"no stagevisor daemon at {address}; start one with stagevisor serve"
    return (
        f"the stagevisor daemon (pid {holder}) that holds {address} does not answer: it is still starting, "
        f"wedged or stopped (SIGSTOP); wait for it, or end it with `kill {holder}` "
        f"(`kill -KILL {holder}` if it stays; its workers exit with it)"
    )


def run(args: argparse.Namespace, body: Callable[[], int]) -> int:
    """Run an admin command's `body`; an unreachable daemon or a gRPC error becomes one line and its exit status."""
    import grpc

    from stagevisor.supervisor.admin.servicer import unix_path

    client_security(args)  # a missing or bad --api-key-file / --tls-ca is a usage error (exit 2), not "unreachable"
    try:
        return body()
    except Unreachable:
        message = unreachable_message(args.admin_address)
        if unix_path(args.admin_address) is None and not client_security(args).tls:
            message += f" (a daemon serving TLS there needs --tls-ca FILE, --tls or ${ENV_TLS_CA})"
        print(f"error: {message}", file=sys.stderr)
        if getattr(args, "format", None) == "json":  # a script reading stdout gets the error, not nothing
            print(json.dumps(StagevisorError(ErrorCode.DAEMON_UNREACHABLE, message).to_json()))
        return EXIT_UNREACHABLE
    except grpc.RpcError as error:
        print(f"error: {error.details()}", file=sys.stderr)
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
