"""Commands that replace or add a process group's workers at run time: restart and scale."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.commands.admin import add_admin_options, call, placement_refusal, run
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.numbers import counted

if TYPE_CHECKING:  # the reports import protobuf, which `stagevisor plan` does without
    from stagevisor.supervisor.reports import ReplicaReport


SCALE_EXAMPLE = "stagevisor scale pipeline=3"
"""The first example of `scale --help`, which a malformed GROUP=N repeats: `pipeline` is a group of the quickstart
daemon (the default voice as declared), which has no `vocoder` group."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    restart = subparsers.add_parser(
        "restart",
        help="replace one process group's worker (or its replicas, one at a time) with new processes, "
        "without failing a request",
        description="Start a new worker for one process group beside its running one; once the new one is "
        "READY, new requests go to it, the old one finishes the requests it holds (for as long as a "
        "request may run, --request-timeout, and never less than --drain-timeout), then stops. Returns once "
        "the old one is gone; no request fails. Should the new "
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
        epilog="examples:\n  stagevisor restart pipeline\n"
        "  stagevisor restart pipeline --force\n  stagevisor restart pipeline --format json\n"
        "  stagevisor scale pipeline=2 && stagevisor restart pipeline/1\n\n"
        "--format json prints one object: {group, old_pid, new_pid, state, workers: [{name, pid}]}: the old and "
        "new pid of a single worker, or, when a replicated group restarted one replica at a time, null pids and "
        "each replica's new pid; a refusal prints {error: {code, message}}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_admin_options(restart, formats=True)
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
        epilog=f"examples:\n  {SCALE_EXAMPLE}\n"
        "  stagevisor scale pipeline=1 --format json\n\n"
        "--format json prints one object: {group, old_replicas, new_replicas, workers: [{name, pid}]}: the group's "
        "workers after the change, each with its pid (null for one with no process now); a refusal prints "
        "{error: {code, message}}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_admin_options(scale, formats=True)
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


def _failed(args: argparse.Namespace, error: Any, what: str) -> int:
    """The exit status of a restart or scale the daemon did not carry out in time or refused; re-raises others.

    Past START_WAIT the change goes on in the daemon (exit 1, saying so). A refusal by the rules `plan` checks
    (no room on the GPU, over the budget) exits 2 like plan and apply, and so does a group the daemon does not run
    (NOT_FOUND, MISSING_PROCESS in JSON); the code is in the JSON error object, never in the `error:` line.
    """
    import grpc

    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        print(_still_running(what), file=sys.stderr)
        return 1
    if error.code() == grpc.StatusCode.NOT_FOUND:  # no such group: the command line names another, as a usage error
        return _refused(args, StagevisorError(ErrorCode.MISSING_PROCESS, error.details()))
    refusal = placement_refusal(error)
    if refusal is None:
        raise error
    return _refused(args, refusal)


def _refused(args: argparse.Namespace, error: StagevisorError) -> int:
    """Exit status 2 for a command the daemon or the rules refused: `error: <message>` on stderr, and with --format
    json the error object (its code) on stdout, as `plan` and `apply` print theirs."""
    print(f"error: {error.message}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(error.to_json()))
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
            return _failed(args, error, f"the restart of group {args.group!r}")
        workers = _replicas_of(topology, msg.name)
        if args.format == "json":
            # A replicated group's reply pids are two different replicas': only the replicas' own pids are said.
            single = not workers
            report = {
                "group": msg.name,
                "old_pid": (msg.old_pid or None) if single else None,
                "new_pid": (msg.new_pid or None) if single else None,
                "state": msg.state,
                "workers": [{"name": w.name, "pid": w.pid} for w in workers],
            }
            print(json.dumps(report))
        elif workers:
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
    group, equals, count = args.assignment.partition("=")
    if not group.strip() or not equals or not count.strip():
        line = f"{args.assignment!r} is malformed; write GROUP=N, e.g. {SCALE_EXAMPLE}"
        return _refused(args, StagevisorError(ErrorCode.MALFORMED_ASSIGNMENT, line))
    from stagevisor.supervisor.config import replicas_from_text

    try:  # as --process-replicas says it: `-1` and `0` are both out of range, not one of them malformed
        replicas = replicas_from_text(count)
    except ValueError as error:
        line = f"{args.assignment!r}: {error}"
        return _refused(args, StagevisorError(ErrorCode.MALFORMED_ASSIGNMENT, line))

    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        import grpc

        request = admin_pb2.ScaleGroupRequest(name=group.strip(), replicas=replicas)
        try:
            msg = call(args, lambda stub: stub.ScaleGroup(request, timeout=START_WAIT))
        except grpc.RpcError as error:
            return _failed(args, error, f"the scale of group {group.strip()!r}")
        # A daemon from before `pids` sends none: each worker's pid is then unknown (None), not a shorter list.
        pids = [(name, (msg.pids[i] if i < len(msg.pids) else 0) or None) for i, name in enumerate(msg.workers)]
        if args.format == "json":
            report = {
                "group": msg.name,
                "old_replicas": msg.old_replicas,
                "new_replicas": msg.new_replicas,
                "workers": [{"name": name, "pid": pid} for name, pid in pids],
            }
            print(json.dumps(report))
            return 0
        workers = ", ".join(f"{name} pid {pid or '-'}" for name, pid in pids)
        if msg.old_replicas == msg.new_replicas:
            print(f"group {msg.name} already has {counted(msg.new_replicas, 'replica')} ({workers}): nothing changed")
        else:
            print(f"scaled group {msg.name}: {msg.old_replicas} -> {counted(msg.new_replicas, 'replica')} ({workers})")
        return 0

    return run(args, body)
