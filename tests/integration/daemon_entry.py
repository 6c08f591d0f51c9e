"""Test entry point: run the daemon on a pickled, hand-built Plan, without the placement code.

    python -m tests.integration.daemon_entry --plan-pickle PLAN.pkl [--admin-address A] [--listen A] ...

runs the same `service.run()` as `stagevisor serve`, so daemon behaviour can be
tested in a subprocess on plans the placement rules would not produce.
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import sys
from pathlib import Path

from stagevisor.supervisor.addresses import DEFAULT_LISTEN, default_admin_address
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.dataplane.admission import AdmissionLimits
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.http.settings import ConnectionLimits, HttpSettings
from stagevisor.supervisor.metrics.resources import parse_rss_budgets
from stagevisor.supervisor.service import configure_logging, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the daemon on a pickled Plan (test entry point).")
    parser.add_argument("--plan-pickle", required=True, type=Path)
    parser.add_argument("--admin-address", default=None)
    parser.add_argument("--listen", default=DEFAULT_LISTEN)
    parser.add_argument("--stop-timeout", type=float, default=10.0)
    parser.add_argument("--drain-timeout", type=float, default=5.0)
    parser.add_argument("--max-restarts", type=int, default=None)
    parser.add_argument("--backoff-initial", type=float, default=0.5)
    parser.add_argument("--backoff-max", type=float, default=10.0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0)
    parser.add_argument("--worker-start", default="forkserver")
    parser.add_argument("--launcher", default="local")
    parser.add_argument("--ray-address", default=None)
    parser.add_argument("--standby-worker", action="append", default=[])
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--metrics", default=None)
    parser.add_argument("--no-metrics", action="store_true")
    parser.add_argument("--rss-budget", action="append", default=[])
    parser.add_argument("--resource-interval", type=float, default=1.0)
    parser.add_argument("--http", default="none", help="HOST:PORT of the HTTP API; none (the default) serves none")
    parser.add_argument("--max-concurrent-requests", type=int, default=AdmissionLimits.max_concurrent)
    parser.add_argument("--max-queued-requests", type=int, default=AdmissionLimits.max_queued)
    parser.add_argument("--queue-timeout", type=float, default=AdmissionLimits.queue_timeout)
    parser.add_argument(
        "--loaded-modules-file",
        type=Path,
        default=None,
        help="as the daemon exits, write the names of the modules it imported to this file",
    )
    parser.add_argument("--http-header-timeout", type=float, default=ConnectionLimits.header_timeout)
    parser.add_argument("--http-body-timeout", type=float, default=ConnectionLimits.body_timeout)
    parser.add_argument("--http-max-connections", type=int, default=None)
    parser.add_argument("--http-allowed-host", action="append", default=[])
    parser.add_argument("--request-timeout", type=float, default=RequestLimits.request_timeout)
    parser.add_argument("--stream-idle-timeout", type=float, default=RequestLimits.stream_idle_timeout)
    parser.add_argument("--pipeline-idle-timeout", type=float, default=RequestLimits.pipeline_idle_timeout)
    args = parser.parse_args(argv)
    plan = pickle.loads(args.plan_pickle.read_bytes())
    options = DaemonOptions(
        metrics=not args.no_metrics,
        metrics_address=args.metrics,
        resource_interval=args.resource_interval,
        rss_budgets=parse_rss_budgets(args.rss_budget, [g.name for g in plan.groups]),
        admin_address=args.admin_address or default_admin_address(),
        listen=args.listen,
        log_level=args.log_level,
        stop_timeout=args.stop_timeout,
        drain_timeout=args.drain_timeout,
        max_restarts=args.max_restarts,
        backoff_initial=args.backoff_initial,
        backoff_max=args.backoff_max,
        start_timeout=args.start_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        worker_start=args.worker_start,
        launcher=args.launcher,
        ray_address=args.ray_address,
        standby_workers=tuple(args.standby_worker),
        http=None if args.http == "none" else args.http,
        admission=AdmissionLimits(args.max_concurrent_requests, args.max_queued_requests, args.queue_timeout),
        request_limits=RequestLimits(
            request_timeout=args.request_timeout,
            stream_idle_timeout=args.stream_idle_timeout,
            pipeline_idle_timeout=args.pipeline_idle_timeout,
        ),
    )
    http_settings = HttpSettings(
        limits=ConnectionLimits(
            header_timeout=args.http_header_timeout,
            body_timeout=args.http_body_timeout,
            max_connections=args.http_max_connections,
        ),
        allowed_hosts=tuple(args.http_allowed_host),
    )
    configure_logging(args.log_level)
    try:
        return asyncio.run(run(plan, options, http_settings=http_settings))
    except DaemonError as error:  # as `stagevisor serve` prints it
        print(f"error: {error.code.value}: {error.message}", file=sys.stderr)
        return 1
    finally:
        if args.loaded_modules_file is not None:
            args.loaded_modules_file.write_text("\n".join(sorted(sys.modules)))


if __name__ == "__main__":
    sys.exit(main())
