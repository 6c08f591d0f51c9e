"""`stagevisor serve`: validate the placement like `plan`, then run the daemon until stopped."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stagevisor.supervisor.commands.serve_options import add_serve_options
from stagevisor.supervisor.addresses import listen_problem
from stagevisor.supervisor.dataplane.admission import AdmissionLimits
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.numbers import seconds_problem

if TYPE_CHECKING:
    from stagevisor.supervisor.http.names import SpeechSettings
from stagevisor.supervisor.http.settings import ConnectionLimits, HttpSettings
from stagevisor.supervisor.security.files import SecurityError, key_file_warning, load_api_key
from stagevisor.supervisor.security.server import Security, check_admin_exposure, load_security

EPILOG = """\
examples:
  stagevisor serve --isolate-stage vocoder      # the default voice, its vocoder in a process of its own
  stagevisor serve --model-path bosonai/higgs-tts-3-4b --stand-ins --isolate-stage audio_encoder
  stagevisor serve --config deploy/examples/fishaudio-s2-pro.yaml --stand-ins --listen 0.0.0.0:50551
  stagevisor serve --http 0.0.0.0:8000 --max-concurrent-requests 8 --max-queued-requests 32
  curl -s localhost:8000/v1/audio/speech -H 'Content-Type: application/json' \\
       -d '{"model": "demo", "input": "Hello there.", "response_format": "wav"}' -o hello.wav
  stagevisor topology            # from another shell: groups, pids, states, edges
  stagevisor stop                # drain, stop every worker, exit (SIGTERM does the same)
  stagevisor serve --metrics 127.0.0.1:9464 --rss-budget pipeline=2G
  stagevisor top                 # live view: CPU, memory against budget, stage latency

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
    add_serve_options(parser)
    parser.set_defaults(handler=_serve, grpc_verbosity=grpc_verbosity)


def speech_settings(args: argparse.Namespace) -> "SpeechSettings":
    """The HTTP API's names and audio settings from the options and the config file; ValueError when unusable."""
    from stagevisor.supervisor.http.names import SpeechSettings
    from stagevisor.supervisor.http.request import SAMPLE_RATE_RANGE
    from stagevisor.supervisor.placement.request import hub_ids, speech_config

    low, high = SAMPLE_RATE_RANGE
    if args.sample_rate is not None and not low <= args.sample_rate <= high:
        raise ValueError(f"--sample-rate {args.sample_rate} is out of range; use {low} to {high}")
    for name in args.served_model_name:
        if not name.strip() or len(name) > 256:
            raise ValueError(f"--served-model-name {name!r} must be a non-empty name of at most 256 characters")
    config_path = args.config
    voices_dir = None if args.voices_dir.lower() in ("none", "off", "") else Path(args.voices_dir)
    return SpeechSettings(
        served_model_names=tuple(args.served_model_name),
        hub_ids=hub_ids(args.model_path, config_path),
        openai_aliases=not args.no_openai_aliases,
        sample_rate=args.sample_rate,
        voices_dir=voices_dir,
        speech=speech_config(args.model_path, config_path),
    )


def _serve(args: argparse.Namespace) -> int:
    from stagevisor.supervisor.commands.placement_options import plan_from_args

    # Same validation as `stagevisor plan`: a StagevisorError here exits 2 before anything starts.
    plan = plan_from_args(args)
    from stagevisor.supervisor.commands.requirements import ensure_runnable

    ensure_runnable(plan, args, "serve")

    import logging

    from stagevisor.supervisor import logs

    # The first line comes before the daemon's heavy imports (gRPC, numpy, the HTTP server): a first
    # run shows what it is doing within its first second.
    logs.configure(args.log_level, "daemon pid %(process)d")
    logging.getLogger("stagevisor.daemon").info(
        "starting: model %s, %d process group%s (%s)",
        plan.model or "from the config",
        len(plan.groups),
        "" if len(plan.groups) == 1 else "s",
        ", ".join(group.name for group in plan.groups),
    )
    from stagevisor.models.requirements import unmet_requirements
    from stagevisor.supervisor.worker.app_paths import import_paths, unimportable_factories

    paths = import_paths(args.app_dir, args.config)
    # The same check `check` and `bench` make before they start anything (models/requirements.py).
    problems = [f"{unmet.code.value}: {unmet.message}" for unmet in unmet_requirements(plan)]
    problems += [
        item.line() for item in unimportable_factories(((stage.name, stage.factory) for stage in plan.stages), paths)
    ]
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1

    import asyncio

    from stagevisor.supervisor.daemon.options import DaemonOptions
    from stagevisor.supervisor.errors import DaemonError
    from stagevisor.supervisor.placement.request import PlacementRequest, voice_names
    from stagevisor.supervisor.service import run

    for flag, address in (("--listen", args.listen), ("--admin-address", args.admin_address)):
        unusable = listen_problem(address)
        if unusable is not None:
            print(f"error: {flag} {address!r}: {unusable}", file=sys.stderr)
            return 2
    timeouts = {
        "--drain-timeout": args.drain_timeout,
        "--stop-timeout": args.stop_timeout,
        "--start-timeout": args.start_timeout,
        "--heartbeat-timeout": args.heartbeat_timeout,
    }
    for flag, seconds in timeouts.items():
        refused = seconds_problem(flag, seconds, zero=True)
        if refused is not None:
            print(f"error: {refused}", file=sys.stderr)
            return 2
    if args.max_restarts is not None and args.max_restarts < 0:
        print("error: --max-restarts must be >= 0", file=sys.stderr)
        return 2
    from stagevisor.supervisor.metrics.resources import parse_rss_budgets

    try:
        rss_budgets = parse_rss_budgets(args.rss_budget, [g.name for g in plan.groups])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.metrics:
        from stagevisor.supervisor.metrics.http import parse_host_port

        try:
            parse_host_port(args.metrics)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    from stagevisor.supervisor.http.server import HttpAddressError, parse_http_address

    try:
        http = parse_http_address(args.http)
        limits = AdmissionLimits(args.max_concurrent_requests, args.max_queued_requests, args.queue_timeout)
    except (HttpAddressError, ValueError) as error:
        # AdmissionLimits names its fields; the operator typed the options.
        field_name, _, rest = str(error).partition(" ")
        flag = {
            "max_concurrent": "--max-concurrent-requests",
            "max_queued": "--max-queued-requests",
            "queue_timeout": "--queue-timeout",
        }.get(field_name, field_name)
        print(f"error: {flag} {rest}", file=sys.stderr)
        return 2
    try:
        speech = speech_settings(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    public_security, admin_security, request_limits = _security_and_limits(args)
    try:
        http_settings = HttpSettings(
            limits=ConnectionLimits(
                header_timeout=args.http_header_timeout,
                body_timeout=args.http_body_timeout,
                keep_alive_timeout=args.http_keep_alive_timeout,
                max_connections=args.http_max_connections,
            ),
            allowed_hosts=tuple(args.http_allowed_host),
            cors_origins=tuple(args.http_cors_origin),
        )
    except ValueError as error:
        field_name, _, rest = str(error).partition(" ")
        print(f"error: --http-{field_name.replace('_', '-')} {rest}", file=sys.stderr)
        return 2
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if speech.voices_dir is not None:
        from stagevisor.supervisor.http.voice_store import REMEDY, unusable_reason

        unusable = unusable_reason(speech.voices_dir)
        if unusable:
            # On by default, so not fatal: the daemon serves; uploads answer voice_store_unavailable until fixed.
            print(f"warning: voice uploads will fail: {unusable}; {REMEDY}", file=sys.stderr)
    key_files = {
        "--api-key-file": args.api_key_file,
        "--admin-api-key-file": args.admin_api_key_file,
        "--tls-key": args.tls_key,
    }
    for flag, path in key_files.items():
        key_warning = key_file_warning(path, flag)
        if key_warning:
            print(f"warning: {key_warning}", file=sys.stderr)
    options = DaemonOptions(
        admin_address=args.admin_address,
        listen=args.listen,
        log_level=args.log_level,
        drain_timeout=args.drain_timeout,
        stop_timeout=args.stop_timeout,
        start_timeout=args.start_timeout,
        max_restarts=args.max_restarts,
        import_paths=paths,
        metrics=not args.no_metrics,
        metrics_address=args.metrics,
        rss_budgets=rss_budgets,
        heartbeat_timeout=args.heartbeat_timeout,
        worker_start=args.worker_start,
        launcher=args.launcher,
        ray_address=args.ray_address,
        standby_workers=tuple(args.standby_worker),
        http=None if http is None else args.http,
        admission=limits,
        public_security=public_security,
        admin_security=admin_security,
        admin_allowed_uids=tuple(args.admin_allow_uid),
        request_limits=request_limits,
        voice_names=voice_names(PlacementRequest(config_path=args.config)) or {},
    )
    try:
        return asyncio.run(run(plan, options, speech=speech, http_settings=http_settings))
    except DaemonError as error:
        print(f"error: {error.code.value}: {error.message}", file=sys.stderr)
        return 1


def grpc_verbosity(args: argparse.Namespace) -> str:
    """GRPC_VERBOSITY for the daemon and its workers when the operator set none (the CLI applies it).

    gRPC core's own stderr lines (e.g. `add_port.cc ... Failed to add port` ahead of our one-line
    port-in-use error) stay away from the operator unless --log-level DEBUG asks for them.
    """
    return "ERROR" if args.log_level == "DEBUG" else "NONE"


def _security_and_limits(args: argparse.Namespace) -> tuple[Security, Security, RequestLimits]:
    """The public and admin endpoints' Security and the request limits; SecurityError (exit 2) when unusable."""
    public = load_security(
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, api_key_file=args.api_key_file
    )
    admin = public.with_api_key(load_api_key(args.admin_api_key_file, "--admin-api-key-file"))
    if admin.api_key is not None and admin.api_key == public.api_key:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            "--admin-api-key-file holds the same token as --api-key-file; the admin API needs "
            "its own token, or every synthesis client could stop the daemon",
        )
    check_admin_exposure(args.admin_address, admin)
    try:
        limits = RequestLimits(
            max_audio_seconds=args.max_audio_seconds,
            request_timeout=args.request_timeout,
            stream_idle_timeout=args.stream_idle_timeout,
            pipeline_idle_timeout=args.pipeline_idle_timeout,
        )
    except ValueError as error:
        raise StagevisorError(ErrorCode.INVALID_CONFIG, str(error)) from None
    from stagevisor.supervisor.dataplane.request_state import KEEP_ALIVE_INTERVAL

    shortest = 2 * KEEP_ALIVE_INTERVAL
    if limits.pipeline_idle_timeout <= shortest:
        raise StagevisorError(
            ErrorCode.INVALID_CONFIG,
            f"--pipeline-idle-timeout {limits.pipeline_idle_timeout:g}: a worker says which requests it holds every "
            f"{KEEP_ALIVE_INTERVAL:g} s, so a timeout of {shortest:g} s or less fails requests that are going on; "
            f"give more than {shortest:g} s (default {RequestLimits.pipeline_idle_timeout:g})",
        )
    return public, admin, limits
