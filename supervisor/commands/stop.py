"""`stagevisor stop`: drain the daemon's requests, stop its workers, and wait until it is gone."""

from __future__ import annotations

import argparse
import sys
import time

from stagevisor.supervisor.addresses import unix_path
from stagevisor.supervisor.commands.admin import add_admin_options, call, run
from stagevisor.supervisor.numbers import seconds_problem
from stagevisor.supervisor.pids import pid_alive
from stagevisor.supervisor.security.client import check_admin_socket, client_security


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stop = subparsers.add_parser(
        "stop",
        help="drain in-flight requests, stop every worker and the daemon",
        description="Ask the daemon to shut down: health goes NOT_SERVING, in-flight requests get up to "
        "--grace seconds, then every worker is stopped. Returns once the daemon is gone. A stop while one drains "
        "ends the drain within its own --grace if that is sooner (`stop --grace 0` ends it now), as a second "
        "SIGTERM or SIGINT does.",
        epilog="example: stagevisor stop --grace 10",
    )
    add_admin_options(stop)
    stop.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drain time for in-flight requests (default: the daemon's --drain-timeout)",
    )
    stop.set_defaults(handler=_stop)


def _stop(args: argparse.Namespace) -> int:
    problem = None if args.grace is None else seconds_problem("--grace", args.grace, zero=True)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        request = admin_pb2.ShutdownRequest()
        if args.grace is not None:
            request.grace_seconds = args.grace
        pid = call(args, lambda stub: stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)).pid
        msg = call(args, lambda stub: stub.Shutdown(request, timeout=10))
        # Over a unix socket the daemon is on this host: wait for its process too, not just its socket.
        local = unix_path(args.admin_address) is not None
        deadline = time.monotonic() + msg.deadline_seconds
        while time.monotonic() < deadline:
            if not _answers(args) and not (local and pid_alive(pid)):
                print(f"stopped the daemon at {args.admin_address}")
                return 0
            time.sleep(0.1)
        print(
            f"error: the daemon at {args.admin_address} is still running after {msg.deadline_seconds:.0f}s",
            file=sys.stderr,
        )
        return 1

    return run(args, body)


def _answers(args: argparse.Namespace) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = args.admin_address
    path = unix_path(address)
    if path is not None and not path.exists():
        return False
    check_admin_socket(address)
    with client_security(args).channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            return True
        except grpc.RpcError as error:
            return bool(error.code() != grpc.StatusCode.UNAVAILABLE)
