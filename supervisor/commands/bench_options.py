"""`stagevisor bench`'s options, their defaults, and their checks before anything starts: workload, topologies."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.addresses import dial_address
from stagevisor.supervisor.commands.output_format import add_format_option
from stagevisor.supervisor.numbers import seconds_problem
from stagevisor.supervisor.security.client import add_client_options

if TYPE_CHECKING:
    from stagevisor.supervisor.bench.workload import Topology, Workload

PLOT_SUFFIXES = (".png", ".svg")
"""What --plot writes: matplotlib picks the format from the suffix."""
DEFAULT_REQUESTS = 16
"""Measured requests per concurrency (or rate) when neither --requests nor --duration is given."""


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """Every option of `stagevisor bench`, with its default."""
    from stagevisor.supervisor.commands.placement_options import add_model_options

    add_model_options(parser)
    parser.add_argument(
        "--topology",
        action="append",
        default=[],
        metavar="OPTIONS",
        help='a placement in the plan syntax, e.g. "--isolate-stage vocoder", or "declared"; '
        "repeatable (default: declared)",
    )
    parser.add_argument(
        "--address",
        type=dial_address,
        help="benchmark the daemon already serving at this address instead, as it runs (so without --topology, "
        "--model-path, --config or --stand-ins)",
    )
    parser.add_argument(
        "--admin-address",
        metavar="ADDRESS",
        type=dial_address,
        help="with --address: its admin API, for worker CPU and memory figures (dialled with the same TLS options "
        "and token)",
    )
    parser.add_argument("--text-file", help="one request per line (default: a built-in mix of short and long texts)")
    parser.add_argument(
        "--concurrency", default="1,8", help="closed-loop clients, a comma-separated sweep (default: %(default)s)"
    )
    parser.add_argument("--rate", type=float, help="open loop instead: Poisson arrivals at this many requests/s")
    parser.add_argument("--requests", type=int, help=f"measured requests per concurrency (default: {DEFAULT_REQUESTS})")
    parser.add_argument("--duration", type=float, help="measure for this many seconds per concurrency instead")
    parser.add_argument("--warmup", type=int, default=2, help="requests sent before measuring (default: %(default)s)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="measure every topology N times, interleaved, and report medians with their min-max spread "
        "(default: %(default)s; 3 or more to tell a difference from noise)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an executor option passed with every request; repeatable",
    )
    from stagevisor.supervisor.commands.request_options import add_voice_options

    add_voice_options(parser, every="; sent with every request")
    parser.add_argument(
        "--check-identical",
        action="store_true",
        help="verify every topology produced the same audio for each text (needs deterministic options: the "
        "options each model declares for it are added unless given, as `check` adds them: noise_scale=0 and "
        "noise_w=0 for piper, seed=0 for qwen3-tts; the default voice needs none)",
    )
    add_format_option(parser)
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write a PNG or SVG (by FILE's suffix, .png or .svg) of latency and throughput against load; "
        "needs the bench extra (matplotlib)",
    )
    from stagevisor.supervisor.commands.requirements import add_stand_ins_option

    add_stand_ins_option(parser)
    add_client_options(parser)


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload the options describe; ValueError naming the first option that is out of range or unreadable."""
    from stagevisor.supervisor.bench.workload import DEFAULT_TEXTS, Workload
    from stagevisor.supervisor.commands.request_options import voice_fields
    from stagevisor.supervisor.commands.synthesize import parse_options

    try:
        # An empty item (`1,,2`, a trailing comma) is refused, not skipped: it is a typo for a number.
        concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise ValueError(f"--concurrency expects numbers like 1,8,32, got {args.concurrency!r}") from None
    if min(concurrency) < 1:
        raise ValueError("--concurrency values must be >= 1")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0 requests (0: no warm-up), got {args.warmup}")
    if args.rate is not None and not (0 < args.rate < math.inf):  # nan compares false
        raise ValueError(f"--rate must be a finite number > 0 of requests per second, got {args.rate}")
    if args.requests is not None and args.duration is not None:
        raise ValueError("give --requests or --duration, not both")
    if args.requests is not None and args.requests < 1:
        raise ValueError(f"--requests must be >= 1, got {args.requests}")
    problem = None if args.duration is None else seconds_problem("--duration", args.duration, zero=False)
    if problem:
        raise ValueError(problem)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    texts = list(DEFAULT_TEXTS)
    if args.text_file:
        try:
            with open(args.text_file, encoding="utf-8") as handle:
                texts = [line.strip() for line in handle if line.strip()]
        except (OSError, UnicodeDecodeError) as error:
            reason = (error.strerror or str(error)) if isinstance(error, OSError) else f"not UTF-8 ({error.reason})"
            raise ValueError(f"cannot read --text-file {args.text_file}: {reason}") from None
        if not texts:
            raise ValueError(f"--text-file {args.text_file} has no non-empty line")
    options = parse_options(args.option)
    voice = voice_fields(args)
    if args.check_identical and not args.address:
        from stagevisor.models.requirements import repeatable_options
        from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

        plan = plan_placement(PlacementRequest(args.model_path, args.config))
        options = {**repeatable_options(plan), **options}
    requests = args.requests if args.requests is not None or args.duration is not None else DEFAULT_REQUESTS
    return Workload(
        texts=texts,
        concurrency=concurrency,
        requests=requests,
        duration=args.duration,
        rate=args.rate,
        warmup=args.warmup,
        options=options,
        voice=voice,
    )


def check_plot(path: str) -> None:
    """ValueError unless --plot can be written once the measurement is done: a .png or .svg file in a directory
    that exists and is writable, with matplotlib installed. Checked first: the measurement may take minutes."""
    from pathlib import Path

    from stagevisor.supervisor.bench.plot import require_matplotlib
    from stagevisor.supervisor.commands.synthesize import unwritable

    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ValueError(f"--plot {path}: name the file .png or .svg (the format follows the suffix), got {suffix!r}")
    problem = unwritable(path)
    if problem:
        raise ValueError(f"cannot write --plot {path}: {problem}")
    require_matplotlib()


def check_address_flags(args: argparse.Namespace) -> None:
    """ValueError for an option of the bench's own daemons with --address: that daemon is measured as it runs, and
    a --topology or --model-path silently left out would be reported as measured."""
    if not args.address:
        return
    given = [
        flag
        for flag, value in (
            ("--model-path", args.model_path),
            ("--config", args.config),
            ("--topology", args.topology),
            ("--stand-ins", args.stand_ins),
            ("--check-identical", args.check_identical),  # one daemon: nothing to compare its audio with
        )
        if value
    ]
    if given:
        verb, them = ("applies", "it") if len(given) == 1 else ("apply", "them")
        raise ValueError(
            f"{', '.join(given)} {verb} only to the daemons the bench starts; --address {args.address} measures "
            f"the daemon serving there as it runs: drop {them}, or drop --address to let the bench start its own "
            "daemons"
        )


def check_client_flags(args: argparse.Namespace) -> None:
    """ValueError for a dialling option without --address: the bench's own daemons take no token or TLS."""
    if args.address:
        return
    # The dialling options of add_client_options: for --address only (the bench's own daemons are private).
    dialling = {
        "--api-key-file": args.api_key_file,
        "--tls": args.tls,
        "--tls-ca": args.tls_ca,
        "--tls-client-cert": args.tls_client_cert,
        "--tls-client-key": args.tls_client_key,
    }
    given = [flag for flag, value in dialling.items() if value]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(
            f"{', '.join(given)} {verb} only to the daemon of --address; without it the bench starts its own "
            "daemons on private sockets, which need no token or TLS"
        )


def parse_topology(text: str, model_path: str | None, config: str | None) -> tuple[Topology, dict[str, Any] | None]:
    """A `--topology` text in the plan option syntax -> (Topology, None), or (Topology, the error) when malformed.

    "declared" (or nothing) is the model's own topology. Only placement options are accepted; a malformed
    one is MALFORMED_ASSIGNMENT, and its Topology asks for the declared placement.
    """
    import shlex

    from stagevisor.supervisor.bench.workload import Topology
    from stagevisor.supervisor.commands.placement_options import add_placement_options, request_from_args
    from stagevisor.supervisor.placement.request import PlacementRequest

    label = text.strip() or "declared"
    base = PlacementRequest(model_path, config)
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_placement_options(parser)
    try:
        argv = [] if label == "declared" else shlex.split(text)
        args, unknown = parser.parse_known_args([*base.argv(), *argv])
    except (argparse.ArgumentError, SystemExit, ValueError) as error:
        return Topology(label, base), {"code": "MALFORMED_ASSIGNMENT", "message": f"--topology {label!r}: {error}"}
    if unknown:
        message = f"--topology {label!r}: not a placement option: {' '.join(unknown)}"
        return Topology(label, base), {"code": "MALFORMED_ASSIGNMENT", "message": message}
    return Topology(label, request_from_args(args)), None
