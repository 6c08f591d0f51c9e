"""`stagevisor serve`: validate the placement like `plan`, then run the daemon until stopped."""

from __future__ import annotations

import argparse
import sys

from stagevisor.supervisor.addresses import DEFAULT_HTTP, DEFAULT_LISTEN, default_admin_address
from stagevisor.supervisor.dataplane.admission import AdmissionLimits

EPILOG = """\
examples:
  stagevisor serve --model-path bosonai/higgs-tts-3-4b --isolate-stage audio_encoder
  stagevisor serve --config deploy/examples/fishaudio-s2-pro.yaml --listen 0.0.0.0:50551
  stagevisor serve --http 0.0.0.0:8000 --max-concurrent-requests 8 --max-queued-requests 32
  curl -s localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \
       -d '{"model": "demo", "input": "Hello there.", "response_format": "wav"}' -o hello.wav
  stagevisor topology            # from another shell: groups, pids, states, edges
  stagevisor stop                # drain, stop every worker, exit (SIGTERM does the same)

An invalid placement exits with status 2 before any worker starts; a stage
that fails to build exits with status 1 after printing its exception.
Under systemd (Type=notify) READY=1 is sent once every process group is READY.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the pipeline: one worker process per process group, plus the admin API",
        description=(
            "Validate the placement exactly like `stagevisor plan`, start one worker process per "
            "process group on its GPU under its memory fraction, and serve the synthesis endpoint "
            "(--listen) and the admin API (--admin-address) until SIGTERM, SIGINT or `stagevisor stop`."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    try:
        from stagevisor.supervisor.commands.plan import add_placement_options
    except ImportError:  # the placement command is not part of this build
        add_placement_options = None
    if add_placement_options is not None:
        add_placement_options(parser)
    parser.add_argument("--admin-address", default=default_admin_address(),
                        help="admin API endpoint: unix:PATH (default %(default)s, a private directory) "
                             "or host:port (keep it on loopback: the admin API has no authentication)")
    parser.add_argument("--listen", default=DEFAULT_LISTEN,
                        help="public endpoint for synthesis, health and reflection (default %(default)s)")
    parser.add_argument("--http", default=DEFAULT_HTTP, metavar="HOST:PORT",
                        help="OpenAI-compatible HTTP API, health/readiness and the playground page "
                             "(default %(default)s; port 0 picks a free port; 'none' turns it off)")
    parser.add_argument("--max-concurrent-requests", type=int, default=AdmissionLimits.max_concurrent, metavar="N",
                        help="synthesis requests (gRPC and HTTP together) running at once; 0 = unbounded "
                             "(default %(default)s)")
    parser.add_argument("--max-queued-requests", type=int, default=AdmissionLimits.max_queued, metavar="N",
                        help="requests waiting for a slot; beyond them HTTP 429 + Retry-After / gRPC "
                             "RESOURCE_EXHAUSTED, before any worker sees the request; 0 = no waiting "
                             "(default %(default)s)")
    parser.add_argument("--queue-timeout", type=float, default=AdmissionLimits.queue_timeout, metavar="SECONDS",
                        help="how long a queued request waits for a slot before it gets 429 / "
                             "RESOURCE_EXHAUSTED; 0 = as long as it takes (default %(default)s)")
    parser.add_argument("--app-dir", action="append", default=[], metavar="DIR",
                        help="a directory to import stage factories from, ahead of the config's directory and the "
                             "current directory (both searched by default); repeatable")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        type=str.upper, help="daemon and worker log level (default %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="on shutdown, how long in-flight requests may finish (default %(default)s)")
    parser.add_argument("--stop-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long a worker has to exit after SIGTERM before SIGKILL (default %(default)s)")
    parser.add_argument("--start-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long a worker may take to build its stages (default %(default)s)")
    parser.add_argument("--max-restarts", type=int, default=5, metavar="N",
                        help="consecutive restarts of a crashing group before it is FAILED (default %(default)s)")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a READY worker whose event loop does not answer its heartbeat this long (a stage "
                             "blocked it, or the process is stopped) is killed and restarted; its requests fail "
                             "with UNAVAILABLE; 0 turns heartbeats off (default %(default)s)")
    parser.add_argument("--worker-start", choices=["forkserver", "spawn"], default="forkserver",
                        help="forkserver: workers fork from a server process that has imported the worker's "
                             "modules once, so a restarted worker is READY sooner; spawn: each worker is a fresh "
                             "interpreter (default %(default)s)")
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:
        from stagevisor.supervisor.commands.plan import plan_from_args
    except ImportError:
        print("error: this build has no placement command; use a full stagevisor install", file=sys.stderr)
        return 1
    # Same validation as `stagevisor plan`: a StagevisorError here exits 2 before anything starts.
    plan = plan_from_args(args)
    from stagevisor.stages.extras import missing_extras

    from stagevisor.supervisor.app_paths import import_paths, unimportable_factories

    missing = missing_extras((stage.name, stage.factory) for stage in plan.stages)
    paths = import_paths(args.app_dir, getattr(args, "config", None))
    problems = [item.message() for item in missing]
    problems += [item.message() for item in unimportable_factories(
        ((stage.name, stage.factory) for stage in plan.stages), paths)]
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1

    import asyncio

    from stagevisor.supervisor.daemon import DaemonOptions
    from stagevisor.supervisor.errors import DaemonError
    from stagevisor.supervisor.service import configure_logging, run

    for name in ("drain_timeout", "stop_timeout", "start_timeout", "heartbeat_timeout"):
        if getattr(args, name) < 0:
            print(f"error: --{name.replace('_', '-')} must be >= 0", file=sys.stderr)
            return 2
    if args.max_restarts < 0:
        print("error: --max-restarts must be >= 0", file=sys.stderr)
        return 2
    from stagevisor.supervisor.http.server import HttpAddressError, parse_http_address

    try:
        http = parse_http_address(args.http)
        limits = AdmissionLimits(args.max_concurrent_requests, args.max_queued_requests, args.queue_timeout)
    except (HttpAddressError, ValueError) as error:
        # AdmissionLimits names its fields; the operator typed the options.
        field_name, _, rest = str(error).partition(" ")
        flag = {"max_concurrent": "--max-concurrent-requests", "max_queued": "--max-queued-requests",
                "queue_timeout": "--queue-timeout"}.get(field_name, field_name)
        print(f"error: {flag} {rest}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    options = DaemonOptions(
        admin_address=args.admin_address, listen=args.listen, log_level=args.log_level,
        drain_timeout=args.drain_timeout, stop_timeout=args.stop_timeout,
        start_timeout=args.start_timeout, max_restarts=args.max_restarts, import_paths=paths,
        heartbeat_timeout=args.heartbeat_timeout, worker_start=args.worker_start,
        http=None if http is None else args.http, admission=limits,
    )
    try:
        return asyncio.run(run(plan, options))
    except DaemonError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
