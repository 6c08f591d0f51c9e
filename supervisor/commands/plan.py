"""`stagevisor plan`: validate a placement and print the topology it produces.

Imports only the pure planner: no grpc, numpy or torch, so it answers fast.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.worker.app_paths import add_app_dir_option
from stagevisor.supervisor.commands.output_format import add_format_option
from stagevisor.supervisor.commands.placement_options import (
    add_launcher_options,
    add_placement_options,
    plan_from_args,
)
from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    pass

PLAN_EXAMPLES = """\
examples:
  # The topology a model declares (no options: nothing changes)
  stagevisor plan --model-path fishaudio/s2-pro

  # Put the vocoder in a dedicated process; the model's recommended
  # fractions are applied to the stages on the shared GPU
  stagevisor plan --model-path fishaudio/s2-pro --isolate-stage vocoder

  # Group stages under one process name (this reproduces Higgs-TTS's own
  # topology, so it is a no-op)
  stagevisor plan --model-path bosonai/higgs-tts-3-4b \\
      --stage-process preprocessing=tts_frontend \\
      --stage-process audio_encoder=tts_frontend

  # The stable `vocoder` role resolves to Ming-Omni-TTS's audio_decode stage
  stagevisor plan --model-path ming-omni-tts --isolate-stage vocoder --format json

  # A YAML config: a built-in model with overrides, or a pipeline in full
  stagevisor plan --config deploy/examples/fishaudio-s2-pro.yaml

  # Where every setting came from: model, YAML line, CLI option, edge, default
  stagevisor plan --config deploy/examples/fishaudio-s2-pro.yaml --isolate-stage vocoder --explain

Exit status 0 when the placement is valid, 2 with `error: ...` on stderr when
it is not (and {"error": {"code", "message", ...}} on stdout with --format json).
"""


def register(subparsers: Any) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="validate a placement and print the process topology it produces",
        description=(
            "Resolve the model, apply the YAML config and the placement options to a copy of its "
            "declaration, check every rule (process-safe edges, GPU memory fractions, GPU limits) and "
            "print the process groups, one line each, then the GPU totals and warnings. Nothing is "
            "started. Without placement options the declared topology is printed unchanged."
        ),
        epilog=PLAN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_placement_options(plan)
    add_launcher_options(plan)
    add_format_option(plan)
    add_app_dir_option(plan)
    plan.add_argument(
        "--explain",
        action="store_true",
        help="also show, for every setting of every stage, process group and the placement, where it came "
        "from: the built-in model, a YAML file and line, a CLI option, an edge's recommendation, or a default",
    )
    plan.set_defaults(handler=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    from stagevisor.models.requirements import unmet_requirements
    from stagevisor.supervisor.errors import ErrorCode

    plan = plan_from_args(args)
    unfound = _unfound_factories(plan, args.app_dir, args.config)
    # What `serve` would stop on before any worker starts (a checkpoint it cannot use here): planning loads nothing
    # and may plan for another host, so a warning, not a refusal.
    unmet = [item.message for item in unmet_requirements(plan) if item.code is ErrorCode.MISSING_REQUIREMENT]
    if unfound or unmet:
        plan = replace(plan, warnings=(*plan.warnings, *unfound, *unmet))
    settings = _explain(args, plan) if args.explain else None
    if args.format == "json":
        body = plan.to_json()
        if settings is not None:
            body["explain"] = [s.to_json() for s in settings]
        print(json.dumps(body))
    else:
        print(render_plan(plan))
        if settings is not None:
            from stagevisor.supervisor.placement.explain import render_explain

            print("\n" + render_explain(settings))
    return 0


def _unfound_factories(plan: Plan, app_dirs: list[str], config: str | None) -> list[str]:
    """A warning per stage whose factory module cannot be found where `serve` would look, without importing it.

    A warning, not an error: the plan may be for another machine, or for a daemon started elsewhere
    with --app-dir; `serve` refuses to start on the same finding.
    """
    from stagevisor.supervisor.worker.app_paths import import_paths, unimportable_factories

    pairs = ((stage.name, stage.factory) for stage in plan.stages)
    return [item.line() for item in unimportable_factories(pairs, import_paths(app_dirs, config))]


def _explain(args: argparse.Namespace, plan: Plan) -> Any:
    from stagevisor.supervisor.placement.explain import explain

    return explain(
        args.model_path,
        args.config,
        plan,
        args.isolate_stage,
        args.stage_process,
        args.process_replicas,
    )


def _number(value: float) -> str:
    from stagevisor.supervisor.placement.wording import fraction_text  # as the placement messages write it

    return fraction_text(value)


def _share(group: str, fraction: float | None) -> str:
    """`group 0.85`, or `group -` for a group without a fraction."""
    return f"{group} {_number(fraction)}" if fraction is not None else f"{group} -"


def render_plan(plan: Plan) -> str:
    """The table form: process groups padded to the longest name, then GPU totals, then warnings."""
    width = max(len(g.name) for g in plan.groups)
    lines = [f"{g.name.ljust(width)} : {', '.join(g.stages)}{_replicas_text(g)}" for g in plan.groups]
    lines.append("")
    by_group = {w.name: g for g in plan.groups for w in g.workers()}
    for gpu in plan.gpus:
        if gpu.total_gpu_memory_fraction is None:
            # Only possible for a GPU one process has to itself: no fractions needed.
            lines.append(
                f"GPU {gpu.id}: {', '.join(gpu.groups)} alone, no fractions declared (limit {_number(gpu.limit)})"
            )
            continue
        shares = ", ".join(_share(name, by_group[name].total_gpu_memory_fraction) for name in gpu.groups)
        lines.append(f"GPU {gpu.id}: {_number(gpu.total_gpu_memory_fraction)} of limit {_number(gpu.limit)} ({shares})")
    if not plan.gpus:
        lines.append("GPU: none (every stage runs on CPU)")
    lines.extend(f"warning: {w}" for w in plan.warnings)
    return "\n".join(lines)


def _replicas_text(group: Any) -> str:
    bounds = group.autoscale
    scaling = f"  [autoscale {bounds.min_replicas}-{bounds.max_replicas} replicas]" if bounds is not None else ""
    if group.replicas == 1:
        return scaling
    if group.gpu is None:
        return f"  [{group.replicas} replicas]{scaling}"
    where = ", ".join(f"{w.name} gpu {w.gpu}" for w in group.workers())
    return f"  [{group.replicas} replicas: {where}]{scaling}"
