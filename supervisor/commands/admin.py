"""Commands on a daemon's admin API: topology, status, events, restart, scale, apply, stop.

grpc is imported inside the handlers: `stagevisor plan` imports this module
to build the parser and must not pay for (or depend on) grpc.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from stagevisor.supervisor.addresses import default_admin_address
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.numbers import whole_number
from stagevisor.supervisor.pids import pid_alive
from stagevisor.supervisor.security import ENV_TLS_CA, add_client_options, check_admin_socket, client_security

if TYPE_CHECKING:  # the reports and messages import protobuf, which `stagevisor plan` does without
    from stagevisor.supervisor._proto import admin_pb2
    from stagevisor.supervisor.reports import (
        GroupReport,
        GroupResources,
        GroupStatus,
        ReplicaReport,
        StatusReport,
        TopologyReport,
    )

CONNECT_TIMEOUT = 2.0
EXIT_UNREACHABLE = 1


class Unreachable(Exception):
    """No daemon answered at the admin address."""


def register(subparsers: argparse._SubParsersAction) -> None:
    def common(parser: argparse.ArgumentParser, *, formats: bool = False) -> None:
        parser.add_argument(
            "--admin-address", default=default_admin_address(), help="the daemon's admin endpoint (default %(default)s)"
        )
        if formats:
            parser.add_argument(
                "--format", choices=["table", "json"], default="table", help="output format (default: table)"
            )
        add_client_options(parser)

    topology = subparsers.add_parser(
        "topology",
        help="show the running process groups, their pids, states and edges",
        description="Show the plan the daemon runs with runtime facts: per process group its worker pid, "
        "state, restarts, GPU and memory fraction (and whether it is enforced); per edge its "
        "transport. --format json prints `stagevisor plan --format json` plus those fields.",
        epilog="example: stagevisor topology --format json | jq '.groups[] | {name, pid, state}'",
    )
    common(topology, formats=True)
    topology.set_defaults(handler=_topology)

    status = subparsers.add_parser(
        "status",
        help="show the daemon's state, groups ready and the first failure",
        description="Show the daemon's state, uptime, process groups READY, requests in flight, each "
        "group's measured memory against its budget (n/a where GPU memory cannot be measured), "
        "a warning line per group over its budget, and the root cause when something failed: the first "
        "failure since every worker was last READY. Once every worker is READY again the incident is over: "
        "status shows it as the last incident, with when it happened and when it ended (JSON: "
        "root_cause.recovered_at), until the next one.",
        epilog="examples:\n  stagevisor status\n  stagevisor status --format json | jq .state\n"
        "  stagevisor status --admin-address unix:/run/stagevisor/admin.sock",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(status, formats=True)
    status.set_defaults(handler=_status)

    events = subparsers.add_parser(
        "events",
        help="follow process-group lifecycle events as they happen",
        description="Print the daemon's recent lifecycle events first (up to 64: how the groups got "
        "where they are), then one line per lifecycle transition (STARTING, READY, BACKOFF, FAILED, ...) of "
        "every process group, with its pid and reason, and one WARNING line when a group goes "
        "over its memory budget (NOTICE when it is back within), until the daemon stops or "
        "Ctrl-C. --format json prints one JSON object per line (`kind`: TRANSITION, WARNING, "
        "NOTICE).",
        epilog="example: stagevisor events &  stagevisor restart vocoder",
    )
    common(events, formats=True)
    events.set_defaults(handler=_events)

    restart = subparsers.add_parser(
        "restart",
        help="replace one process group's worker (or its replicas, one at a time) with new processes, "
        "without failing a request",
        description="Start a new worker for one process group beside its running one; once the new one is "
        "READY, new requests go to it, the old one finishes the requests it holds (up to "
        "--request-timeout), then stops. Returns once the old one is gone; no request fails. Should the new "
        "worker die meanwhile, the old one takes the group's requests again until the new one is READY (or "
        "the drain's time is up: then it stops anyway and its requests still running fail). Other groups "
        "keep running. A GPU group needs room for both workers on its GPU (OVER_LIMIT or MISSING_FRACTION, "
        "exit status 2, when it has none; nothing changes). --force stops the worker first (SIGTERM, then "
        "SIGKILL after the stop timeout), as a FAILED group always is: its requests in flight fail and new "
        "ones fail UNAVAILABLE until the new worker is READY. A replicated group restarts one replica at a "
        "time: each is taken out of rotation, drains its requests, restarts, and is READY before the next, "
        "so the group never stops serving. GROUP/INDEX restarts one replica.",
        epilog="examples:\n  stagevisor restart vocoder\n  stagevisor restart vocoder/1\n"
        "  stagevisor restart pipeline --force",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(restart)
    restart.add_argument(
        "group",
        metavar="GROUP",
        help="process group name, as `stagevisor topology` shows, or GROUP/INDEX for one replica",
    )
    restart.add_argument(
        "--force",
        action="store_true",
        help="stop a single worker before its new one starts, for a GPU without room for both: requests in "
        "flight there fail, and new ones until it is READY",
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
    common(scale)
    scale.add_argument("assignment", metavar="GROUP=N", help="process group and its new replica count")
    scale.set_defaults(handler=_scale)

    apply = subparsers.add_parser(
        "apply",
        help="move the running daemon to a new topology without failing a request",
        description="Plan the new topology from the same inputs as `stagevisor plan` (the same rules: an unsafe "
        "edge, a missing fraction or an over-budget GPU is refused with its code), print the difference from the "
        "running one (groups added, removed, changed, merged, split), then move the daemon to it: every worker of "
        "the new topology starts beside the running ones, new requests switch to it once all are READY, "
        "requests in flight finish on the old workers, then those stop. A refusal (including a new worker that "
        "fails to start, or a GPU that cannot hold both topologies during the switch) changes nothing. "
        "--dry-run only prints the difference.",
        epilog="examples:\n  stagevisor apply --isolate-stage vocoder --dry-run\n"
        "  stagevisor apply --isolate-stage vocoder\n  stagevisor apply            # back to the declared topology\n"
        "  stagevisor apply --config deploy/examples/vocoder-own-process.yaml --format json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from stagevisor.supervisor.commands.plan import add_placement_options

    add_placement_options(apply)
    common(apply, formats=True)
    apply.add_argument("--dry-run", action="store_true", help="print the difference and change nothing")
    apply.set_defaults(handler=_apply)

    stop = subparsers.add_parser(
        "stop",
        help="drain in-flight requests, stop every worker and the daemon",
        description="Ask the daemon to shut down: health goes NOT_SERVING, in-flight requests get up to "
        "--grace seconds, then every worker is stopped. Returns once the daemon is gone.",
        epilog="example: stagevisor stop --grace 10",
    )
    common(stop)
    stop.add_argument(
        "--grace",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drain time for in-flight requests (default: the daemon's --drain-timeout)",
    )
    stop.set_defaults(handler=_stop)


def _call(args: argparse.Namespace, method: Callable[[Any], Any]) -> Any:
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


def _run(args: argparse.Namespace, body: Callable[[], int]) -> int:
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


def _topology(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        msg = _call(args, lambda stub: stub.GetTopology(admin_pb2.GetTopologyRequest(), timeout=10))
        from stagevisor.supervisor.reports import TopologyReport

        report = TopologyReport.from_proto(msg)
        print(json.dumps(report.to_json()) if args.format == "json" else format_topology(report))
        return 0

    return _run(args, body)


def _status(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        msg = _call(args, lambda stub: stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))
        from stagevisor.supervisor.reports import StatusReport

        report = StatusReport.from_proto(msg)
        print(json.dumps(report.to_json()) if args.format == "json" else format_status(report))
        return 0

    return _run(args, body)


def format_event(event: admin_pb2.LifecycleEvent) -> str:
    """`HH:MM:SS group: OLD -> NEW pid N (reason)` for one LifecycleEvent; `HH:MM:SS group: WARNING reason`
    for a condition (a group over its memory budget)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.time))
    if event.kind:
        return f"{stamp} {event.group}: {event.kind} {event.reason}"
    pid = f" pid {event.pid}" if event.pid else ""
    reason = f" ({event.reason})" if event.reason else ""
    return f"{stamp} {event.group}: {event.old_state} -> {event.new_state}{pid}{reason}"


def _events(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        def follow(stub) -> None:
            from stagevisor.supervisor.admin.servicer import HISTORY_HEADER, REPLAYED_HEADER

            stream = stub.WatchEvents(admin_pb2.WatchEventsRequest(), metadata=((HISTORY_HEADER, "1"),))
            # The daemon sends headers once subscribed: no event is missed after.
            headers = dict(stream.initial_metadata() or ())
            replayed = int(headers.get(REPLAYED_HEADER, "0") or 0)
            print(f"following lifecycle events of the daemon at {args.admin_address}", file=sys.stderr, flush=True)
            for index, event in enumerate(stream):
                if args.format == "json":
                    print(
                        json.dumps(
                            {
                                "group": event.group,
                                "old_state": event.old_state,
                                "new_state": event.new_state,
                                "pid": event.pid or None,
                                "reason": event.reason,
                                "time": event.time,
                                "kind": event.kind or "TRANSITION",
                                "replayed": index < replayed,
                            }
                        ),
                        flush=True,
                    )
                else:
                    print(format_event(event), flush=True)

        _call(args, follow)
        return 0

    return _run(args, body)


RESTART_WAIT = 900.0
"""Seconds `stagevisor restart` waits for the daemon's answer (a new worker may load a model for minutes)."""


def _restart(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        import grpc

        def restart(stub: Any) -> tuple[Any, Any]:
            # A worker may take minutes to load its model: the deadline is the daemon's start timeout.
            request = admin_pb2.RestartGroupRequest(name=args.group, force=args.force)
            reply = stub.RestartGroup(request, timeout=RESTART_WAIT)
            # For a replicated group the reply holds only the first old and the last new pid (two different
            # replicas): each replica's own pid comes from the topology.
            topology = None if "/" in args.group else stub.GetTopology(admin_pb2.GetTopologyRequest(), timeout=10)
            return reply, topology

        try:
            msg, topology = _call(args, restart)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                # The daemon's restart is not tied to this client: it goes on, and ends on its own bounds.
                print(
                    f"error: group {args.group!r} has not finished restarting after {RESTART_WAIT:.0f} s, so this "
                    "command stops waiting; the restart goes on in the daemon (a new worker's model load, then "
                    "the old worker's drain, bounded by --drain-timeout and --request-timeout): "
                    "`stagevisor events` shows when it ends, `stagevisor topology` the group's pid",
                    file=sys.stderr,
                )
                return 1
            if _placement_refusal(error) is None:
                raise
            # No room beside the worker on its GPU: exit 2 like scale; the line keeps the code.
            print(f"error: {error.details()}", file=sys.stderr)
            return 2
        workers = _replicas_of(topology, msg.name)
        if workers:
            pids = ", ".join(f"{w.name} pid {w.pid or '-'}" for w in workers)
            print(f"restarted group {msg.name}, one replica at a time: {pids} ({msg.state})")
        else:
            print(f"restarted group {msg.name}: pid {msg.old_pid or '-'} -> {msg.new_pid} ({msg.state})")
        return 0

    return _run(args, body)


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
            msg = _call(args, lambda stub: stub.ScaleGroup(request, timeout=900))  # new replicas may load models
        except grpc.RpcError as error:
            if _placement_refusal(error) is None:
                raise
            # Refused by the rules `plan` checks: exit 2 like plan and apply; scale has no --format json,
            # so the line keeps the code (`error: OVER_LIMIT: ...`).
            print(f"error: {error.details()}", file=sys.stderr)
            return 2
        print(f"scaled group {msg.name}: {msg.old_replicas} -> {msg.new_replicas} replicas ({', '.join(msg.workers)})")
        return 0

    return _run(args, body)


def _placement_refusal(error: Any) -> StagevisorError | None:
    """The placement error a daemon refused a scale or an apply with (FAILED_PRECONDITION `CODE: message`), or None."""
    import grpc

    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    code, _, detail = (error.details() or "").partition(": ")
    if not detail or code not in ErrorCode.__members__:
        return None
    return StagevisorError(ErrorCode[code], detail)


def _apply(args: argparse.Namespace) -> int:
    from stagevisor.supervisor.commands.plan import request_from_args
    from stagevisor.supervisor.placement.diff import TopologyDiff
    from stagevisor.supervisor.placement.request import plan_placement

    request = request_from_args(args)
    plan_placement(request)  # the same rules here first: a refusal prints its code like `plan` (exit 2)
    text = None
    if request.config_path is not None:
        with open(request.config_path, encoding="utf-8") as config:
            text = config.read()

    def body() -> int:
        import grpc

        from stagevisor.supervisor._proto import admin_pb2

        message = admin_pb2.ApplyRequest(
            isolate_stages=request.isolate_stages,
            stage_processes=request.stage_processes,
            process_replicas=request.process_replicas,
            dry_run=args.dry_run,
        )
        for field, value in (("model_path", request.model_path), ("config_path", request.config_path)):
            if value is not None:
                setattr(message, field, value)
        if text is not None:
            message.config_text = text
        try:
            # Requests in flight on the old topology may run up to the daemon's request timeout.
            reply = _call(args, lambda stub: stub.Apply(message, timeout=3600))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                refusal = _placement_refusal(error)
                if refusal is not None:
                    raise refusal from None
                print(f"error: {error.details()}", file=sys.stderr)
                return 1
            raise
        diff, plan = json.loads(reply.diff_json), json.loads(reply.plan_json)
        if args.format == "json":
            print(json.dumps({"changed": reply.changed, "applied": reply.applied, "diff": diff, "plan": plan}))
            return 0
        print(TopologyDiff.from_json(diff).render())
        if reply.applied:
            print("applied: the daemon runs the new topology")
        elif reply.changed:
            print("dry run: nothing changed")
        return 0

    return _run(args, body)


def _stop(args: argparse.Namespace) -> int:
    if args.grace is not None and not (0 <= args.grace < math.inf):  # nan compares false
        print(f"error: --grace must be a finite number of seconds >= 0, got {args.grace}", file=sys.stderr)
        return 2

    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2
        from stagevisor.supervisor.admin.servicer import unix_path

        request = admin_pb2.ShutdownRequest()
        if args.grace is not None:
            request.grace_seconds = args.grace
        pid = _call(args, lambda stub: stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10)).pid
        msg = _call(args, lambda stub: stub.Shutdown(request, timeout=10))
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

    return _run(args, body)


def _answers(args: argparse.Namespace) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from stagevisor.supervisor.admin.servicer import unix_path

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
            return error.code() != grpc.StatusCode.UNAVAILABLE


def _fmt_fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def format_bytes(value: float | None) -> str:
    """Bytes as MiB or GiB; "n/a" for None (not measurable here, e.g. GPU memory on a CPU machine)."""
    if value is None:
        return "n/a"
    if value >= 1024**3:
        return f"{value / 1024**3:.2f} GiB"
    return f"{value / 1024**2:.1f} MiB"


def _clock(unix_seconds: float) -> str:
    """Local date and time to the second: an incident may be days old."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_seconds))


def format_memory(res: GroupResources | None, pid: int | None) -> str:
    """`rss 120.3 MiB, gpu n/a, budget 256.0 MiB (rss)` plus ` OVER BUDGET` when it is; `pid`: the worker's."""
    if not pid:
        return "memory: no process"  # its last sample would read as a worker using 0 bytes
    if res is None:
        return "memory: not sampled yet"
    text = f"rss {format_bytes(res.rss_bytes)}, gpu {format_bytes(res.gpu_memory_bytes)}"
    if res.memory_budget_bytes is not None:
        text += f", budget {format_bytes(res.memory_budget_bytes)} ({res.budget_kind})"
    else:
        text += ", budget -"
    return text + (" OVER BUDGET" if res.over_budget else "")


def _device_text(worker: GroupReport | ReplicaReport) -> str:
    """` (physical 3, cuda:0 (NVIDIA H200, GPU-...))`: the device a GPU group's worker is isolated to and runs on."""
    parts = [f"physical {worker.physical_gpu}"] if worker.physical_gpu else []
    if worker.gpu is not None and worker.device:
        parts.append(f"on {worker.device}")
    return f" ({', '.join(parts)})" if parts else ""


def _node_text(worker: GroupReport | ReplicaReport | GroupStatus, node: str | None = None) -> str:
    """`  on host vm, node 3f2a9c01d4e5 (pinned: tts-a)`: where a worker on a cluster runs (and is pinned)."""
    text = f"  on host {worker.host or '-'}, node {(worker.node_id or '-')[:12]}"
    return text + (f" (pinned: {node})" if node else "")


def _autoscale_text(group: GroupReport) -> str:
    bounds = group.autoscale
    if bounds is None:
        return ""
    return f"  autoscale {bounds.min_replicas}-{bounds.max_replicas} replicas"


def format_topology(report: TopologyReport) -> str:
    """The plan's group lines (`name : stage, stage`, padded) with runtime columns, then edges and GPUs."""
    groups = report.groups
    width = max((len(g.name) for g in groups), default=0)
    stage_width = max((len(", ".join(g.stages)) for g in groups), default=0)
    lines = [f"model: {report.model or '-'} ({report.model_path or '-'})"]
    standins = [s.name for s in report.stages if s.stand_in]
    if standins:
        lines.append(f"stand-ins: {', '.join(standins)} (the default voice, not the model's weights)")
    on_cluster = any(g.node_id or g.node or any(w.node_id for w in g.workers) for g in groups)
    for g in groups:
        fraction = _fmt_fraction(g.total_gpu_memory_fraction)
        if g.total_gpu_memory_fraction is not None:
            fraction += " enforced" if g.fraction_enforced else " not enforced"
        lines.append(
            f"{g.name:<{width}} : {', '.join(g.stages):<{stage_width}}  "
            f"pid {g.pid or '-':<7} {g.state:<8} restarts {g.restarts:<3} "
            f"gpu {'-' if g.gpu is None else g.gpu}{_device_text(g)}  fraction {fraction}  "
            # A replicated group's memory is its replicas', each on its own line below; never sampled as one.
            f"{format_memory(g.resources, g.pid) if not g.workers else 'memory: per replica'}"
            + (_node_text(g, g.node) if on_cluster else "")
            + _autoscale_text(g)
        )
        for w in g.workers:  # a replicated group: one line per replica
            lines.append(
                f"  {w.name:<{width}} pid {w.pid or '-':<7} {w.state:<8} restarts {w.restarts:<3} "
                f"gpu {'-' if w.gpu is None else w.gpu}{_device_text(w)}  {format_memory(w.resources, w.pid)}"
                + (_node_text(w, w.node) if on_cluster else "")
            )
    if report.edges:
        lines.append("edges:")
        for e in report.edges:
            link = f" ({e.src_group} -> {e.dst_group})" if e.transport != "in_process" else ""
            seen = ", ".join(f"{n} via {t}" for t, n in sorted(e.requests.items()))
            lines.append(
                f"  {e.src} -> {e.dst} [{e.kind}] {e.transport}{link}" + (f"  requests: {seen}" if seen else "")
            )
    for gpu in report.gpus:
        if gpu.total_bytes is not None:
            measured = f", measured {format_bytes(gpu.measured_bytes)} of {format_bytes(gpu.total_bytes)}" + (
                " OVER LIMIT" if gpu.over_limit else ""
            )
        else:
            measured = ", measured n/a"
        lines.append(
            f"gpu {gpu.id}: {gpu.total_gpu_memory_fraction:g} of {gpu.limit:g} ({', '.join(gpu.groups)}){measured}"
        )
    lines.extend(f"warning: {w}" for w in report.warnings)
    return "\n".join(lines)


def format_status(report: StatusReport) -> str:
    lines = [
        f"daemon: {report.state} (pid {report.pid}, up {report.uptime_seconds:.0f}s)",
        f"groups: {report.groups_ready}/{report.groups_total} READY, {report.in_flight} requests in flight",
    ]
    width = max((len(g.name) for g in report.groups), default=0)
    on_cluster = any(g.node_id for g in report.groups)
    for g in report.groups:
        lines.append(
            f"  {g.name:<{width}}  {g.state:<8} pid {g.pid or '-':<7} restarts {g.restarts:<3} "
            f"{format_memory(g.resources, g.pid)}" + (_node_text(g) if on_cluster else "")
        )
    if report.missing_replicas:
        serving = " (DEGRADED: their groups serve through the other replicas)" if report.state == "SERVING" else ""
        lines.append(f"replicas not READY: {', '.join(report.missing_replicas)}{serving}")
    root = report.root_cause
    if root is not None:
        where = f", stage {root.stage!r}" if root.stage else ""
        if root.recovered_at is None:
            lines.append(f"root cause: group {root.group!r}{where}: {root.message}")
        else:
            lines.append(
                f"last incident (over: every worker READY since {_clock(root.recovered_at)}): "
                f"group {root.group!r}{where} at {_clock(root.time)}: {root.message}"
            )
    lines.extend(f"warning: {w}" for w in report.warnings)
    if report.metrics_url:
        lines.append(f"metrics: {report.metrics_url}")
    return "\n".join(lines)
