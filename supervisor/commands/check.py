"""`stagevisor check`: build every stage, run one request, check the Stage contract; optionally verify edges."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any, Iterator

from stagevisor.supervisor.worker.app_paths import add_app_dir_option
from stagevisor.supervisor.commands.output_format import add_format_option
from stagevisor.supervisor import envs
from stagevisor.supervisor.numbers import counted

if TYPE_CHECKING:
    from stagevisor.supervisor.bench.loadgen import VoiceFields
    from stagevisor.supervisor.checks.contract import CheckReport
    from stagevisor.supervisor.plan import Plan

EPILOG = """\
examples:
  stagevisor check --model-path qwen3-tts                   # build, one request, contract report
  stagevisor check --config my-tts.yaml --app-dir .         # your own executors
  stagevisor check --model-path demo --verify-edges         # is each edge process-safe? run it both ways
  stagevisor check --config my-tts.yaml --edge engine,vocoder --format json
  stagevisor check --model-path ./Qwen3-TTS-12Hz-0.6B-Base --reference-audio ref.wav \\
      --reference-transcript "What the reference says."   # a Base checkpoint speaks only in a cloned voice

Exit status: 0 when every stage keeps the contract (and, with --verify-edges,
every edge declared process-safe behaved identically when split); 1 otherwise;
2 for an invalid config or placement, as with `stagevisor plan`.
"""

DEFAULT_TEXTS = ("The quick brown fox jumps over the lazy dog.", "Check two: a second, shorter sentence.")


def register(subparsers: argparse._SubParsersAction) -> None:
    from stagevisor.supervisor.commands.placement_options import add_placement_options

    parser = subparsers.add_parser(
        "check",
        help="build every stage, run one request end to end and check the Stage contract (and edge safety)",
        description=(
            "Import every factory, build every stage and run one request through the planned pipeline, in "
            "this process, checking the Stage contract at every step; report per stage what it received and "
            "returned and for every edge the bytes it would carry across a process boundary. With "
            "--verify-edges (or --edge SRC,DST), run the same deterministic requests with each edge in one "
            "process and split across two worker processes, and compare every payload the stages receive "
            "along every edge, field by field (tensors by value), and the audio byte for byte."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_placement_options(parser)
    from stagevisor.supervisor.commands.requirements import add_stand_ins_option

    add_stand_ins_option(parser)
    parser.add_argument(
        "--text",
        help="the text of the smoke request (and, with --verify-edges, the only one; default: two built-in sentences)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an executor option, as with synthesize; repeatable. The options that make each model's audio "
        "repeatable are added unless given: none for the default voice (its noise seed defaults to 0) and the "
        "stand-ins; noise_scale=0 and noise_w=0 for piper; seed=0 for qwen3-tts (whose preprocessing draws a "
        "random seed otherwise)",
    )
    from stagevisor.supervisor.commands.request_options import add_voice_options

    add_voice_options(parser, every="; sent with every request of the check")
    add_app_dir_option(parser)
    parser.add_argument(
        "--verify-edges", action="store_true", help="split each `next` edge in turn and compare against one process"
    )
    parser.add_argument(
        "--edge",
        action="append",
        default=[],
        metavar="SRC,DST",
        help="verify only this edge (implies --verify-edges); repeatable",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="with --verify-edges, how many topologies run at once, each its own daemon "
        "(default: one per CPU, at most 4)",
    )
    add_format_option(parser)
    # check runs the plan's workers on this host, never on Ray: plan_from_args reads the launcher of plan and serve.
    parser.set_defaults(handler=_check, launcher="local")


def _edges(values: list[str]) -> list[tuple[str, str]]:
    from stagevisor.supervisor.errors import ErrorCode, StagevisorError

    edges = []
    for value in values:
        src, sep, dst = (part.strip() for part in value.partition(","))
        if not sep or not src or not dst or "," in dst:  # `a,b,c` is no edge, not 'a' -> 'b,c'
            raise StagevisorError(
                ErrorCode.MALFORMED_ASSIGNMENT, f"--edge expects SRC,DST (two stage names), got {value!r}"
            )
        edges.append((src, dst))
    return edges


def _check(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from stagevisor.supervisor.worker.app_paths import import_paths
    from stagevisor.supervisor.checks.contract import check_pipeline
    from stagevisor.supervisor.commands.placement_options import plan_from_args
    from stagevisor.supervisor.commands.synthesize import parse_options
    from stagevisor.supervisor.errors import ErrorCode, StagevisorError

    plan = plan_from_args(args)
    from stagevisor.supervisor.commands.request_options import voice_fields
    from stagevisor.models.requirements import repeatable_options
    from stagevisor.supervisor.commands.requirements import ensure_runnable

    try:
        voice = voice_fields(args)  # before anything is built: a file that cannot be read is the command's error
    except ValueError as error:
        raise StagevisorError(ErrorCode.INVALID_CONFIG, str(error)) from None

    ensure_runnable(plan, args, "check")
    edges = _edges(args.edge)
    if args.jobs is not None and args.jobs < 1:
        raise StagevisorError(ErrorCode.INVALID_CONFIG, f"--jobs must be at least 1, got {args.jobs}")
    options = {**repeatable_options(plan), **parse_options(args.option)}
    paths = import_paths(args.app_dir, args.config)
    sys.path[:0] = [p for p in paths if p not in sys.path]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    texts = [args.text] if args.text is not None else list(DEFAULT_TEXTS)  # --text '' is a text too
    verify = bool(args.verify_edges or edges)
    if verify:  # a pipeline or an edge it cannot verify is refused before anything is built
        from stagevisor.supervisor.checks.edges import edges_to_verify

        edges_to_verify(plan, edges)
    unmet = _unmet(plan)  # what serve checks before any worker starts: nothing is built on a plan that lacks it
    with _shared_graph_cache() if verify else contextlib.nullcontext():
        report = unmet if unmet is not None else asyncio.run(check_pipeline(plan, _request(texts[0], options, voice)))
        verdicts = []
        if verify and report.ok:
            from stagevisor.supervisor.checks.edges import verify_edges

            requests = [_request(text, options, voice) for text in texts]
            verdicts = asyncio.run(verify_edges(plan, requests, edges or None, import_paths=paths, jobs=args.jobs))
    if args.format == "json":
        print(json.dumps({**report.to_json(), "edge_checks": [v.to_json() for v in verdicts]}, indent=2))
    else:
        _print_table(report, verdicts)
    return 0 if report.ok and not any(v.mismatch for v in verdicts) else 1


def _unmet(plan: Plan) -> CheckReport | None:
    """A failed CheckReport naming what the plan lacks here (an extra, the model's checkpoint), as `serve` refuses
    it before any worker starts; None when nothing is missing."""
    from stagevisor.models.requirements import unmet_requirements
    from stagevisor.supervisor.checks.contract import CheckReport, ContractViolation

    unmet = unmet_requirements(plan)
    if not unmet:
        return None
    # Each stops several stages (an extra's) or the whole model (its checkpoint): no one `stage`, all in `stages`.
    violations = [
        ContractViolation(
            item.stages[0] if len(item.stages) == 1 else None,
            "requirements",
            item.message,
            code=item.code.value,
            stages=item.stages,
        )
        for item in unmet
    ]
    return CheckReport(plan.model, violations=violations)


@contextlib.contextmanager
def _shared_graph_cache() -> Iterator[None]:
    """One optimized-graph cache for every worker of every topology --verify-edges starts, removed at the end.

    Each topology is its own daemon, whose workers would otherwise each cut and
    optimize the embedded voice's graphs again (about a second of CPU per worker):
    the in-process check saves them first and every worker loads them
    (stages/piper/sessions.py; the audio is bit-identical). The operator's own
    STAGEVISOR_CACHE_DIR wins, empty (no cache) included.
    """
    import os
    import tempfile

    if envs.CACHE_DIR.is_set():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="svcheck-cache") as cache:
        os.environ[envs.CACHE_DIR.name] = cache
        try:
            yield
        finally:
            os.environ.pop(envs.CACHE_DIR.name, None)


def _request(text: str, options: dict[str, str], voice: VoiceFields) -> dict[str, Any]:
    return {
        "text": text,
        "voice": voice.voice,
        "reference_audio": voice.reference_audio,
        "reference_transcript": voice.reference_transcript,
        "options": options,
    }


def _print_table(report: Any, verdicts: list[Any]) -> None:
    # Only the stages that ran: a stage built before another's build failed has nothing to show.
    ran = [stage for stage in report.stages.values() if stage.received is not None]
    # Columns as wide as their longest cell, header included (as report_text lays out topology and status).
    width = max([len("stage"), *(len(stage.name) for stage in ran)])
    group_width = max([len("group"), *(len(stage.group) for stage in ran)])
    if ran:
        print(f"{'stage':<{width}}  {'group':<{group_width}} {'build':>8} {'process':>8}  received -> returned")
    for stage in ran:
        print(
            f"{stage.name:<{width}}  {stage.group:<{group_width}} {stage.build_seconds * 1000:>6.0f}ms "
            f"{stage.process_seconds * 1000:>6.0f}ms  {_short(stage.received)} -> {_short(stage.returned)}"
        )
    if ran:
        print()
    for edge in (e for e in report.edges.values() if e.handoffs):
        print(
            f"edge {edge.src} -> {edge.dst} ({edge.kind}): {edge.transport}, {counted(edge.handoffs, 'handoff')}, "
            f"{edge.bytes} bytes encoded"
        )
    if report.ok:
        print(f"\nok: {report.audio_seconds:.2f} s of audio at {report.sample_rate} Hz")
    for violation in report.violations:
        print(f"error: {violation.code}: {violation}")
    if verdicts:
        edge_width = max([len("edge"), *(len(f"{v.src} -> {v.dst}") for v in verdicts)])
        print(f"\n{'edge':<{edge_width}}  {'declared':<8}  {'observed':<9}  first difference")
        for v in verdicts:
            name = f"{v.src} -> {v.dst}"
            print(
                f"{name:<{edge_width}}  {'safe' if v.declared_safe else 'unsafe':<8}  "
                f"{'identical' if v.identical else 'differs':<9}  {v.difference or '-'}"
            )
        suggest = [f"[{v.src}, {v.dst}]" for v in verdicts if v.identical and not v.declared_safe]
        if suggest:
            print(
                "\nbehaved identically when split; declare after review: process_safe_edges: ["
                + ", ".join(suggest)
                + "]"
            )
        for v in verdicts:
            if v.mismatch:
                print(
                    f"error: EDGE_MISMATCH: edge {v.src!r} -> {v.dst!r} is declared process-safe but "
                    f"differs when split: {v.difference}"
                )


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 70 else text[:67] + "..."
