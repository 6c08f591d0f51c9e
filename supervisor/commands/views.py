"""Commands that read a daemon's state: topology, status and events (the admin API's read-only side)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stagevisor.supervisor.commands.admin import add_admin_options, call, run
from stagevisor.supervisor.commands.report_text import event_json, format_event, format_status, format_topology


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topology = subparsers.add_parser(
        "topology",
        help="show the running process groups, their pids, states and edges",
        description="Show the plan the daemon runs with runtime facts: per process group its worker pid, "
        "state, restarts, GPU and memory fraction (and whether it is enforced); per edge its "
        "transport and the completed requests that crossed it, by transport (a failed or cancelled request is "
        "not counted here; stagevisor_edge_handoffs_total counts every handoff). A READY worker that missed "
        "three heartbeats in a row is marked `silent Ns` (JSON: silent_s, the seconds since; null while it "
        "beats). --format json prints `stagevisor plan --format json` plus those fields.",
        epilog="example: stagevisor topology --format json | jq '.groups[] | {name, pid, state}'",
    )
    add_admin_options(topology, formats=True)
    topology.set_defaults(handler=_topology)

    status = subparsers.add_parser(
        "status",
        help="show the daemon's state, groups ready and the first failure",
        description="Show the daemon's state, uptime, process groups READY, requests in flight, each "
        "group's measured memory against its budget (n/a where GPU memory cannot be measured), "
        "a warning line per group over its budget, and the root cause when something failed: the first "
        "failure since every worker was last READY. Once every worker is READY again the incident is over: "
        "status shows it as the last incident, with when it happened and when it ended (JSON: "
        "root_cause.recovered_at), until the next one. A READY worker that missed three heartbeats in a row "
        "(a stopped process, a blocked event loop) is marked `silent Ns` (JSON: silent_s, the seconds since it "
        "counts as silent; null while it beats); while a group has no READY worker that answers, the daemon "
        "is DEGRADED. It also shows where the daemon serves, as bound: the "
        "public endpoint (JSON: listen; the port a --listen HOST:0 got), the HTTP API (http_url) and the "
        "metrics (metrics_url).",
        epilog="examples:\n  stagevisor status\n  stagevisor status --format json | jq .state\n"
        "  stagevisor status --admin-address unix:/run/stagevisor/admin.sock",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_admin_options(status, formats=True)
    status.set_defaults(handler=_status)

    events = subparsers.add_parser(
        "events",
        help="follow process-group lifecycle events as they happen",
        description="Print the daemon's recent lifecycle events first (up to 64: how the groups got "
        "where they are), then one line per lifecycle transition (STARTING, READY, BACKOFF, FAILED, ...) of "
        "every process group, with its pid and reason, one WARNING line when a group goes "
        "over its memory budget (NOTICE when it is back within) or a worker misses three heartbeats in a row "
        "(NOTICE when it beats again), a line for each apply (APPLIED, or WARNING "
        "when the daemon refused it), for each `stagevisor scale` that changed a group's count (SCALED, naming "
        "its workers and pids after it) and for each autoscaling decision (AUTOSCALE), until the daemon stops "
        "or Ctrl-C. --format json prints one JSON object per line (`kind`: TRANSITION, APPLIED, WARNING, "
        "NOTICE, SCALED, AUTOSCALE).",
        epilog="example: stagevisor events &  stagevisor restart pipeline",
    )
    add_admin_options(events, formats=True)
    events.set_defaults(handler=_events)


def _topology(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        msg = call(args, lambda stub: stub.GetTopology(admin_pb2.GetTopologyRequest(), timeout=10))
        from stagevisor.supervisor.reports import TopologyReport

        report = TopologyReport.from_proto(msg)
        print(json.dumps(report.to_json()) if args.format == "json" else format_topology(report))
        return 0

    return run(args, body)


def _status(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        msg = call(args, lambda stub: stub.GetStatus(admin_pb2.GetStatusRequest(), timeout=10))
        from stagevisor.supervisor.reports import StatusReport

        report = StatusReport.from_proto(msg)
        print(json.dumps(report.to_json()) if args.format == "json" else format_status(report))
        return 0

    return run(args, body)


def _events(args: argparse.Namespace) -> int:
    def body() -> int:
        from stagevisor.supervisor._proto import admin_pb2

        def follow(stub: Any) -> None:
            from stagevisor.supervisor.admin.servicer import HISTORY_HEADER, REPLAYED_HEADER

            stream = stub.WatchEvents(admin_pb2.WatchEventsRequest(), metadata=((HISTORY_HEADER, "1"),))
            # The daemon sends headers once subscribed: no event is missed after.
            headers = dict(stream.initial_metadata() or ())
            replayed = int(headers.get(REPLAYED_HEADER, "0") or 0)
            print(f"following lifecycle events of the daemon at {args.admin_address}", file=sys.stderr, flush=True)
            for index, event in enumerate(stream):
                if args.format == "json":
                    print(json.dumps(event_json(event, index < replayed)), flush=True)
                else:
                    print(format_event(event), flush=True)

        call(args, follow)
        return 0

    return run(args, body)
