"""`stagevisor bench`: run one workload against several topologies of a model and print them side by side."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.addresses import dial_address
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.numbers import seconds_problem
from stagevisor.supervisor.security.client import add_client_options, client_security

if TYPE_CHECKING:
    from stagevisor.supervisor.bench.workload import Topology, Workload
    from stagevisor.supervisor.security.client import ClientSecurity

PLOT_SUFFIXES = (".png", ".svg")
"""What --plot writes: matplotlib picks the format from the suffix."""
DEFAULT_REQUESTS = 16
"""Measured requests per concurrency (or rate) when neither --requests nor --duration is given."""
CLIENT_FLAGS = ("api_key_file", "tls", "tls_ca", "tls_client_cert", "tls_client_key")
"""The dialling options of add_client_options: for --address only (the bench's own daemons are private)."""

EPILOG = """\
examples:
  stagevisor bench --model-path demo --topology declared --topology "--isolate-stage vocoder" --concurrency 1,8
  stagevisor bench --model-path demo --topology declared --topology "--isolate-stage vocoder" --repeats 3
  stagevisor bench --model-path qwen3-tts --topology declared --topology "--isolate-stage vocoder" \\
      --text-file my-texts.txt --concurrency 1,8,32 --requests 64 --plot bench.png
  stagevisor bench --model-path ./Qwen3-TTS-12Hz-0.6B-Base --reference-audio ref.wav \\
      --reference-transcript "What the reference says." --concurrency 1,4   # a Base checkpoint clones a voice
  stagevisor bench --address 127.0.0.1:50551 --rate 4 --duration 30      # a running daemon, Poisson arrivals
  STAGEVISOR_API_KEY=$(cat api.key) stagevisor bench --address tts.example:50551 --tls-ca ca.pem --requests 32
  stagevisor bench --model-path demo --topology declared --topology "--isolate-stage vocoder" \\
      --check-identical --format json

Each topology gets a fresh daemon on private sockets, a warm-up, the measured
run at each concurrency, then a clean stop. With --repeats N this happens N
times, the topologies interleaved (A B, B A, A B, ...) so that a drift in the
machine's load falls on each alike; every figure is then the median of the N
runs with their min-max spread, and a difference within the spread is called
so. The report records the machine's CPUs and load average. An invalid
topology is reported with its error code and the others still run. Ratios
compare every topology with the first valid one. Exit status 1 when a
topology failed to run (its daemon did not start, ended or stopped answering
during the measurement, which stops there: DAEMON_FAILED; no request of a run
succeeded, or 16 were refused before any did, which stops it there too, not at
the end of --duration: REQUESTS_FAILED; the admin API of --admin-address did not answer
or refused: DAEMON_UNREACHABLE, TLS_MISMATCH, DAEMON_REFUSED) or
--check-identical found different audio; 2 when an option is invalid (with
--format json, {"error": {"code", "message"}} on stdout) or every topology is
invalid (nothing was measured), as with `stagevisor plan`.

With --address the bench dials as `synthesize` does: the token from
--api-key-file or $STAGEVISOR_API_KEY, TLS from --tls-ca or
$STAGEVISOR_TLS_CA; --admin-address gets the same token (an admin API on TCP
has a token of its own: use its unix address, or leave it out). A request
that fails UNAVAILABLE without a connection waits up to 5 s for the daemon to
answer again, then stops the run (DAEMON_FAILED, or TLS_MISMATCH when a
daemon answers there in the other protocol); an UNAVAILABLE or
RESOURCE_EXHAUSTED the daemon sends itself counts as a failed request.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from stagevisor.supervisor.commands.plan import add_model_options

    parser = subparsers.add_parser(
        "bench",
        help="measure a workload on each candidate topology, side by side",
        description="Run one workload (texts, concurrency or rate, options) against several topologies of one "
        "model, each on a fresh daemon, and print throughput, time to first audio, latency, real-time "
        "factor, errors and worker resources side by side, with ratios against the first topology.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="write a PNG or SVG (by FILE's suffix, .png or .svg) of latency and throughput against load; "
        "needs the bench extra (matplotlib)",
    )
    from stagevisor.supervisor.commands.requirements import add_stand_ins_option

    add_stand_ins_option(parser)
    add_client_options(parser)
    parser.set_defaults(handler=run)


def _workload(args: argparse.Namespace) -> Workload:
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


def _check_plot(path: str) -> None:
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


def _check_address_flags(args: argparse.Namespace) -> None:
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


def _check_client_flags(args: argparse.Namespace) -> None:
    """ValueError for a dialling option without --address: the bench's own daemons take no token or TLS."""
    if args.address:
        return
    given = [f"--{name.replace('_', '-')}" for name in CLIENT_FLAGS if getattr(args, name, None)]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(
            f"{', '.join(given)} {verb} only to the daemon of --address; without it the bench starts its own "
            "daemons on private sockets, which need no token or TLS"
        )


class Progress:
    """One line on stderr, rewritten in place on a terminal: where the bench is and the time left."""

    def __init__(self, total: int | None, seconds: float | None) -> None:
        self.total, self.seconds = total, seconds
        self.done = 0
        self.started = time.monotonic()
        self.stage = ""
        self.tty = sys.stderr.isatty()

    def step(self, stage: str | None = None) -> None:
        if stage is not None:
            self.stage = stage
            if not self.tty:
                print(f"bench: {stage}", file=sys.stderr, flush=True)
        else:
            self.done += 1
        if not self.tty:
            return
        elapsed = time.monotonic() - self.started
        if self.total:
            width = 30
            filled = int(width * min(1.0, self.done / self.total))
            left = elapsed / self.done * (self.total - self.done) if self.done else None
            eta = f"~{left:.0f} s left" if left is not None else "estimating"
            text = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {eta}  {self.stage}"
        else:
            text = f"{self.done} requests, {elapsed:.0f} s  {self.stage}"
        print(f"\r\x1b[K{text[:120]}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def parse_topology(text: str, model_path: str | None, config: str | None) -> tuple[Topology, dict[str, Any] | None]:
    """A `--topology` text in the plan option syntax -> (Topology, None), or (Topology, the error) when malformed.

    "declared" (or nothing) is the model's own topology. Only placement options are accepted; a malformed
    one is MALFORMED_ASSIGNMENT, and its Topology asks for the declared placement.
    """
    import shlex

    from stagevisor.supervisor.bench.workload import Topology
    from stagevisor.supervisor.commands.plan import add_placement_options, request_from_args
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


def run(args: argparse.Namespace) -> int:
    from stagevisor.supervisor.bench.loadgen import RunFailed, Unreachable
    from stagevisor.supervisor.commands.admin import tls_mismatch
    from stagevisor.supervisor.bench.measure import machine
    from stagevisor.supervisor.bench.results import Row, TopologyResult, combine
    from stagevisor.supervisor.bench.workload import Topology, validate
    from stagevisor.supervisor.placement.request import PlacementRequest

    try:
        workload = _workload(args)
        _check_client_flags(args)
        _check_address_flags(args)
        if args.plot:
            _check_plot(args.plot)
    except (ValueError, ImportError) as error:
        # The CLI's error contract: one line on stderr, {"error": ...} on stdout with --format json, exit 2.
        raise StagevisorError(ErrorCode.INVALID_CONFIG, str(error)) from None
    security = client_security(args) if args.address else None  # a bad --api-key-file or --tls-ca: exit 2
    model = None  # the daemon at --address serves what it serves; the report says "a running daemon"
    if args.address:
        results = [TopologyResult(Topology(f"daemon at {args.address}", PlacementRequest()))]
    else:
        from stagevisor.supervisor.commands.requirements import ensure_runnable, refuse_unmet
        from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

        plan = plan_placement(PlacementRequest(args.model_path, args.config))
        ensure_runnable(plan, args, "bench")
        refuse_unmet(plan)  # as serve checks it, before any daemon starts (each would stop on it)
        model = plan.model  # as `plan` and `topology` name it: `demo` when no model is given
        parsed = [parse_topology(text, args.model_path, args.config) for text in (args.topology or ["declared"])]
        results = [TopologyResult(t, error or validate(t)) for t, error in parsed]
    for result in results:
        if result.error is not None:
            print(
                f"error: topology `{result.topology.label}`: {result.error['code']}: {result.error['message']}",
                file=sys.stderr,
            )
    runs = len(workload.concurrency) if not workload.rate else 1
    valid = sum(r.error is None for r in results)
    total = args.repeats * valid * (workload.warmup + runs * workload.requests) if workload.requests else None
    progress = Progress(total, None)
    failed = False
    machine_before = machine()
    repeats: dict[int, list[list[Row]]] = {id(r): [] for r in results}
    try:
        for repeat in range(args.repeats):
            # A B, then B A, ...: a load that drifts during the bench weighs on every topology alike.
            for result in results if repeat % 2 == 0 else results[::-1]:
                if result.error is not None:
                    continue
                try:
                    if args.address:
                        asyncio.run(_one_at_address(result, args, workload, progress, security))
                    else:
                        asyncio.run(_one(result, args, workload, progress))
                except (RuntimeError, RunFailed) as error:
                    # RuntimeError: the daemon the bench started ended (Daemon); RunFailed carries its own code.
                    code = error.code if isinstance(error, RunFailed) else "DAEMON_FAILED"
                    message = str(error)
                    if security is not None and isinstance(error, Unreachable):
                        # A daemon there that answers in the other protocol: the command's TLS settings are wrong.
                        mismatch = tls_mismatch(args.address, security.tls_from, message)
                        if mismatch is not None:
                            code, message = mismatch.code.value, mismatch.message
                    result.error = {"code": code, "message": message[-2000:]}
                    print(f"error: topology `{result.topology.label}`: {code}: {message}", file=sys.stderr)
                    failed = True
                    continue
                repeats[id(result)].append(result.rows)
    except KeyboardInterrupt:
        progress.close()
        print("bench: interrupted; every daemon it started is stopped", file=sys.stderr)
        return 130
    progress.close()
    for result in results:
        if result.error is None:
            result.rows = combine(repeats[id(result)])
    measured_on = {**machine_before, "load_average_after": machine()["load_average"]}
    status = _report(results, args, workload, measured_on, model) or (1 if failed else 0)
    # The report still shows each topology's error code; a run that measured nothing must not pass as done.
    return 2 if valid == 0 else status


async def _one_at_address(
    result: Any, args: argparse.Namespace, workload: Any, progress: Progress, security: ClientSecurity | None
) -> None:
    """One measurement of the daemon at --address, dialled with the CLI's TLS options and token."""
    from stagevisor.supervisor.bench.measure import measure

    pids = _pids(args) if args.admin_address else {}
    result.groups = pids
    progress.step(f"measuring {result.topology.label}")
    result.rows = await measure(args.address, workload, progress.step, pids, result.digests, security)


async def _one(result: Any, args: argparse.Namespace, workload: Any, progress: Progress) -> None:
    """One measurement of a topology on a daemon of its own, started and stopped here."""
    from stagevisor.supervisor.bench.daemon import Daemon
    from stagevisor.supervisor.bench.measure import measure

    label = result.topology.label
    progress.step(f"starting a daemon for `{label}`")
    daemon = Daemon(
        [*result.topology.request.argv(), *(["--stand-ins"] if args.stand_ins else [])],
        log=lambda text: print(f"bench: {text}", file=sys.stderr),
    )
    result.daemon_pid = daemon.proc.pid
    try:
        await daemon.wait_serving()
        pids = await daemon.worker_pids()
        result.groups = pids
        progress.step(f"measuring `{label}`")
        result.rows = await daemon.while_serving(measure(daemon.listen, workload, progress.step, pids, result.digests))
    finally:
        # Runs on Ctrl-C too (the main task is cancelled): the daemon drains and stops its workers.
        daemon.stop()


def _pids(args: argparse.Namespace) -> dict[str, int]:
    """Process group -> worker pid of the daemon at --admin-address, asked as the admin commands ask (its socket
    checked, the CLI's TLS options and token); RunFailed with the admin commands' code when it does not answer
    (DAEMON_UNREACHABLE, TLS_MISMATCH) or refuses (DAEMON_REFUSED)."""
    import grpc

    from stagevisor.supervisor._proto import admin_pb2
    from stagevisor.supervisor.bench.loadgen import RunFailed
    from stagevisor.supervisor.commands.admin import Unreachable, call, unreachable_error
    from stagevisor.supervisor.reports import TopologyReport

    try:
        message = call(args, lambda stub: stub.GetTopology(admin_pb2.GetTopologyRequest(), timeout=10))
    except Unreachable as unreachable:
        error = unreachable_error(args, unreachable)
        raise RunFailed(f"--admin-address: {error.message}", error.code.value) from None
    except grpc.RpcError as refused:
        raise RunFailed(f"--admin-address {args.admin_address}: {refused.details()}", "DAEMON_REFUSED") from None
    return {group.name: group.pid for group in TopologyReport.from_proto(message).groups if group.pid}


def _report(
    results: list, args: argparse.Namespace, workload: Any, measured_on: dict[str, Any], model: str | None
) -> int:
    """Print the report (and write --plot); `model` is the planned model's name, None for the daemon at --address."""
    from stagevisor.supervisor.bench.compare import add_ratios, identical, verdict

    add_ratios(results)
    same = identical(results) if args.check_identical else None
    report = {
        "model": model,
        "workload": {
            "texts": len(workload.texts),
            "concurrency": list(workload.concurrency),
            "rate": workload.rate,
            "requests_per_row": workload.requests,
            "duration_per_row": workload.duration,
            "warmup": workload.warmup,
            "options": workload.options,
            "voice": workload.voice.voice,
            "reference_audio": args.reference_audio,
            "repeats": args.repeats,
        },
        "machine": measured_on,
        "topologies": [r.to_json() for r in results],
        "identical": same,
        "summary": verdict(results),
    }
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    if args.plot:
        from stagevisor.supervisor.bench.plot import plot

        try:
            plot(report, args.plot)
        except OSError as error:  # checked before measuring; the disk may have filled or the directory gone since
            print(f"error: cannot write --plot {args.plot}: {error.strerror or error}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if same is not None and not same["identical"] else 0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _with_spread(row: dict[str, Any], name: str, value: float | None, scale: float, digits: int) -> str:
    """`median (min-max)` over the repeats, or the value alone after one run."""
    if value is None:
        return "-"
    spread = row.get("spread", {}).get(name)
    text = f"{value * scale:.{digits}f}"
    if spread is not None and len(row.get("repeats", [])) > 1:
        text += f" ({spread[0] * scale:.{digits}f}-{spread[1] * scale:.{digits}f})"
    return text


COLUMNS = (
    ("topology", "<", 34),
    ("load", ">", 6),
    ("req/s", ">", 19),
    ("audio s/s", ">", 19),
    ("ttfa p50 ms", ">", 22),
    ("ttfa p90 ms", ">", 11),
    ("e2e p50 ms", ">", 22),
    ("e2e p99 ms", ">", 10),
    ("rtf x", ">", 5),
    ("stall p90 ms", ">", 12),
    ("errors n", ">", 8),
    ("req/s ratio x", ">", 13),
    ("ttfa Δ ms", ">", 9),
)
"""The table's columns, each header with its unit (x: a ratio, n: a count; load: c = clients, /s = requests/s)."""


def _line(cells: list[str]) -> str:
    return " ".join(f"{cell:{align}{width}}" for cell, (_, align, width) in zip(cells, COLUMNS, strict=True)).rstrip()


def _print_table(report: dict[str, Any]) -> None:
    repeats = report["workload"].get("repeats", 1)
    if repeats > 1:
        print(f"medians of {repeats} interleaved runs per point, (min-max) over the runs")
    print(_line([name for name, _, _ in COLUMNS]))
    for topology in report["topologies"]:
        label = topology["label"][:34]
        if topology["error"]:
            print(f"{label:<34} {topology['error']['code']}: {topology['error']['message'][:90]}")
            continue
        for row in topology["rows"]:
            load = f"c{row['concurrency']}" if row["concurrency"] else f"{row['rate']:g}/s"
            errors = sum(row["errors"].values())
            delta = row["ratios"].get("ttfa_p50_delta_seconds")
            noise = row.get("within_spread", {})
            ratio = _x(row["ratios"].get("requests_per_second"))
            print(
                _line(
                    [
                        label,
                        load,
                        _with_spread(row, "requests_per_second", row["requests_per_second"], 1, 2),
                        _with_spread(row, "audio_seconds_per_second", row["audio_seconds_per_second"], 1, 2),
                        _with_spread(row, "ttfa_p50", row["ttfa"]["p50"], 1000, 1),
                        _ms(row["ttfa"]["p90"]),
                        _with_spread(row, "latency_p50", row["latency"]["p50"], 1000, 1),
                        _ms(row["latency"]["p99"]),
                        f"{(row['real_time_factor'] or 0):.2f}",
                        _ms(row["stall"].get("p90")),
                        str(errors),
                        ratio + ("~" if noise.get("requests_per_second") else ""),
                        ("-" if delta is None else f"{delta * 1000:+.1f}") + ("~" if noise.get("ttfa_p50") else ""),
                    ]
                )
            )
            label = ""
        print()
    print(
        "units: load cN = N clients in a closed loop, R/s = requests per second offered (open loop); "
        "s/s = audio seconds per wall second; ms = milliseconds; x = a ratio; n = a count"
    )
    if any(any(row.get("within_spread", {}).values()) for t in report["topologies"] for row in t["rows"]):
        print("~: the difference from the first topology is within the spread of the runs (not a measured difference)")
    measured = report.get("machine")
    if measured:
        print(
            f"machine: {measured['usable_cpus']} of {measured['cpus']} CPUs usable; load average "
            f"{measured['load_average'][0]:g} (1 min) at the start, {measured['load_average_after'][0]:g} at the end"
        )
    print("worker resources per measured run (CPU seconds, peak RSS MiB; GPU n/a on this machine):")
    for topology in report["topologies"]:
        for row in topology["rows"]:
            load = f"c{row['concurrency']}" if row["concurrency"] else f"{row['rate']:g}/s"
            parts = [
                f"{g} {r['cpu_seconds'] if r['cpu_seconds'] is not None else '-'} s "
                f"{(r['peak_rss_bytes'] or 0) / 2**20:.0f} MiB"
                for g, r in row["resources"].items()
            ]
            print(f"  {topology['label'][:34]:<34} {load:>6}: " + "; ".join(parts))
    if report["identical"] is not None:
        same = report["identical"]
        print(
            "audio identical across topologies: "
            + (
                "yes"
                if same["identical"]
                else "NO: " + ", ".join(f"text {d['text_index'] + 1} on `{d['topology']}`" for d in same["differing"])
            )
        )
    print()
    for line in report["summary"]:
        print(line)
