"""`stagevisor bench`: run one workload against several topologies of a model and print them side by side."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.commands.bench_options import (
    add_bench_options,
    check_address_flags,
    check_client_flags,
    check_plot,
    parse_topology,
    workload_from_args,
)
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.security.client import client_security

if TYPE_CHECKING:
    from stagevisor.supervisor.security.client import ClientSecurity

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
    parser = subparsers.add_parser(
        "bench",
        help="measure a workload on each candidate topology, side by side",
        description="Run one workload (texts, concurrency or rate, options) against several topologies of one "
        "model, each on a fresh daemon, and print throughput, time to first audio, latency, real-time "
        "factor, errors and worker resources side by side, with ratios against the first topology.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_options(parser)
    parser.set_defaults(handler=run)


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
            text = f"{counted(self.done, 'request')}, {elapsed:.0f} s  {self.stage}"
        print(f"\r\x1b[K{text[:120]}", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from stagevisor.supervisor.bench.loadgen import RunFailed, Unreachable
    from stagevisor.supervisor.commands.admin import tls_mismatch
    from stagevisor.supervisor.bench.measure import machine
    from stagevisor.supervisor.bench.results import Row, TopologyResult, combine
    from stagevisor.supervisor.bench.workload import Topology, validate
    from stagevisor.supervisor.placement.request import PlacementRequest

    try:
        workload = workload_from_args(args)
        check_client_flags(args)
        check_address_flags(args)
        if args.plot:
            check_plot(args.plot)
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
    from stagevisor.supervisor.bench.table import print_table

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
        print_table(report)
    if args.plot:
        from stagevisor.supervisor.bench.plot import plot

        try:
            plot(report, args.plot)
        except OSError as error:  # checked before measuring; the disk may have filled or the directory gone since
            print(f"error: cannot write --plot {args.plot}: {error.strerror or error}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}", file=sys.stderr)
    return 1 if same is not None and not same["identical"] else 0
