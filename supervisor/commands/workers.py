"""Commands that replace or add a process group's workers at run time: restart and scale."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.commands.admin import add_admin_options, call, placement_refusal, run
from stagevisor.supervisor.numbers import whole_number

if TYPE_CHECKING:  # the reports import protobuf, which `stagevisor plan` does without
    from stagevisor.supervisor.reports import ReplicaReport


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    restart = subparsers.add_parser(
        "restart",
        help="replace one process group's worker (or its replicas, one at a time) with new processes, "
        "without failing a request",
        description="Start a new worker for one process group beside its running one; once the new one is "
        "READY, new requests go to it, the old one finishes the requests it holds (up to "
        "--request-timeout), then stops. Returns once the old one is gone; no request fails. Should the new "
        "worker die meanwhile, the old one takes the group's requests again until the new one is READY (or "
        "the drain's time is up: then it stops anyway, its requests still running fail, and the restart "
        "fails, exit status 1, while the group follows its crash recovery). Other groups "
        "keep running. A GPU group needs room for both workers on its GPU (OVER_LIMIT or MISSING_FRACTION, "
        "exit status 2, when it has none; nothing changes). --force stops the worker first (SIGTERM, then "
        "SIGKILL after the stop timeout), as a FAILED group always is: its requests in flight fail and new "
        "ones fail UNAVAILABLE until the new worker is READY; given while a restart without a pause drains "
        "the old worker, it stops that one once the new one serves. A replicated group restarts one replica at a "
        "time: each is taken out of rotation, drains its requests, restarts, and is READY before the next, "
        "so the group never stops serving. GROUP/INDEX restarts one replica. A group the daemon does not run "
        "is exit status 2.",
        epilog="examples:\n  stagevisor restart vocoder\n  stagevisor restart vocoder/1\n"
        "  stagevisor restart pipeline --force",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_admin_options(restart)
    restart.add_argument(
        "group",
        metavar="GROUP",
        help="process group name, as `stagevisor topology` shows, or GROUP/INDEX for one replica",
    )
    restart.add_argument(
        "--force",
        action="store_true",
        help="stop a single worker before its new one starts, for a GPU without room for both: requests in "
        "flight there fail, and new ones until it is READY; during a restart without a pause, stop the old "
        "worker without waiting for its requests",
    )
    restart.set_defaults(handler=_restart)

    scale = subparsers.add_parser(
        "scale",
        help="run N replicas of a process group, at run time",
        description="Start new replicas of a process group (each takes requests once READY) or drain and "
        "stop the highest-indexed ones. Checked first against the GPU budget exactly as "
        "`stagevisor plan --process-replicas` checks it: a refusal (OVER_LIMIT, "
        "MISSING_FRACTION, TP_STAGE, MISSING_PROCESS) changes nothing.",
        epilog="example: stagevisor scale vocoder=3",
    )
    add_admin_options(scale)
    scale.add_argument("assignment", metavar="GROUP=N", help="process group and its new replica count")
    scale.set_defaults(handler=_scale)


START_WAIT = 900.0
"""Seconds `stagevisor restart` and `scale` wait for the daemon's answer (a new worker may load a model for
minutes, then an old one drain its requests)."""


def _still_running(what: str) -> str:
    """What the operator reads when `what` outlasts START_WAIT: the daemon's change is not tied to this client."""
    return (
        f"error: {what} has not finished after {START_WAIT:.0f} s, so this command stops waiting; it goes on in "
        "the daemon (a new worker's model load, then an old worker's drain, bounded by --drain-timeout and "
        "--request-timeout): `stagevisor events` shows when it ends, `stagevisor topology` the group's workers"
    )


def _failed(error: Any, what: str) -> int:
    """The exit status of a restart or scale the daemon did not carry out in time or refused; re-raises others.

    Past START_WAIT the change goes on in the daemon (exit 1, saying so). A refusal by the rules `plan` checks
    (no room on the GPU, over the budget) exits 2 like plan and apply, its line keeping the code, and so does a
    group the daemon does not run (NOT_FOUND).
    """
    import grpc

    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        print(_still_running(what), file=sys.stderr)
        return 1
    if error.code() == grpc.StatusCode.NOT_FOUND:  # no such group: the command line names another, as a usage error
        print(f"error: {error.details()}", file=sys.stderr)
        return 2
    if placement_refusal(error) is None:
        raise error
    print(f"error: {error.details()}", file=sys.stderr)
    return 2


def _restart(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        import grpc

        def restart(stub: Any) -> tuple[Any, Any]:
            # A worker may take minutes to load its model: the deadline is the daemon's start timeout.
            request = admin_pb2.RestartGroupRequest(name=args.group, force=args.force)
            reply = stub.RestartGroup(request, timeout=START_WAIT)
            # For a replicated group the reply holds only the first old and the last new pid (two different
            # replicas): each replica's own pid comes from the topology.
            topology = None if "/" in args.group else stub.GetTopology(admin_pb2.GetTopologyRequest(), timeout=10)
            return reply, topology

        try:
            msg, topology = call(args, restart)
        except grpc.RpcError as error:
            return _failed(error, f"the restart of group {args.group!r}")
        workers = _replicas_of(topology, msg.name)
        if workers:
            pids = ", ".join(f"{w.name} pid {w.pid or '-'}" for w in workers)
            print(f"restarted group {msg.name}, one replica at a time: {pids} ({msg.state})")
        else:
            print(f"restarted group {msg.name}: pid {msg.old_pid or '-'} -> {msg.new_pid} ({msg.state})")
        return 0

    return run(args, body)


def _replicas_of(topology: Any, group: str) -> tuple[ReplicaReport, ...]:
    """The replicas of `group` in a GetTopology reply (none when it is not replicated, or the reply is None)."""
    if topology is None:
        return ()
    from stagevisor.supervisor.reports import TopologyReport

    return next((g.workers for g in TopologyReport.from_proto(topology).groups if g.name == group), ())


def _scale(args: argparse.Namespace) -> int:
    group, _, count = args.assignment.partition("=")
    replicas = whole_number(count.strip())
    if not group.strip() or replicas is None:
        print(
            f"error: {args.assignment!r} is malformed; write GROUP=N, e.g. stagevisor scale vocoder=2", file=sys.stderr
        )
        return 2
    from stagevisor.supervisor.config import check_replicas

    try:
        check_replicas(replicas)
    except ValueError as error:
        print(f"error: {args.assignment!r}: {error}", file=sys.stderr)
        return 2

    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        import grpc

        request = admin_pb2.ScaleGroupRequest(name=group.strip(), replicas=replicas)
        try:
            msg = call(args, lambda stub: stub.ScaleGroup(request, timeout=START_WAIT))
        except grpc.RpcError as error:
            return _failed(error, f"the scale of group {group.strip()!r}")
        print(f"scaled group {msg.name}: {msg.old_replicas} -> {msg.new_replicas} replicas ({', '.join(msg.workers)})")
        return 0

    return run(args, body)
