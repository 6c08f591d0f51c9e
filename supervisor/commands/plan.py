"""`stagevisor plan` (validate a placement, print the topology) and `stagevisor models` (what each model allows).

Imports only the pure planner: no grpc, numpy or torch, so both answer fast.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

from stagevisor.supervisor.worker.app_paths import app_dir
from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.placement.request import PlacementRequest

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

MODELS_EXAMPLES = """\
examples:
  stagevisor models
  stagevisor models --format json
"""


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    """The options `plan` and `serve` share, so both validate a placement the same way."""
    group = add_model_options(parser)
    _add_assignment_options(group)


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """--launcher and --ray-address, which `plan` and `serve` take (plan_from_args checks the cluster)."""
    group = parser.add_argument_group("launcher")
    group.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local: worker processes on this host; ray: each worker under a Ray actor on the "
        "cluster of --ray-address (needs `stagevisor[ray]`); with `plan`, also checks that "
        "the cluster has the nodes and GPUs the plan needs (default %(default)s)",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster for --launcher ray (e.g. 10.0.0.5:6379); default: RAY_ADDRESS, "
        "else the cluster `ray start` runs on this host",
    )


def add_model_options(parser: argparse.ArgumentParser) -> Any:
    """--model-path and --config (the model, without placement); returns the argument group."""
    group = parser.add_argument_group("placement")
    group.add_argument(
        "--model-path",
        metavar="MODEL",
        help="a registry key (see `stagevisor models`), an HF-style path such as fishaudio/s2-pro, "
        "or a local directory whose config.json names a known architecture; "
        "default: the embedded demo voice",
    )
    group.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML config: a built-in model with stage overrides merged by name, or a pipeline declared "
        "in full (see deploy/examples/)",
    )
    return group


def _add_assignment_options(group: Any) -> None:
    group.add_argument(
        "--isolate-stage",
        action="append",
        default=[],
        metavar="STAGE",
        help="run STAGE alone in a process named STAGE (shorthand for --stage-process STAGE=STAGE); a stage the "
        "model already runs alone keeps its process and name (a no-op); repeatable; a role alias such as `vocoder` "
        "works too",
    )
    group.add_argument(
        "--stage-process",
        action="append",
        default=[],
        metavar="STAGE=PROCESS",
        help="place STAGE in process PROCESS; repeat with the same PROCESS to group stages in it",
    )
    group.add_argument(
        "--process-replicas",
        action="append",
        default=[],
        metavar="PROCESS=N",
        help="run N worker processes for process group PROCESS (data parallel; requests go to the least "
        "loaded); repeatable; overrides `processes: {PROCESS: {replicas: N}}` in the YAML config",
    )


def request_from_args(args: argparse.Namespace) -> PlacementRequest:
    """The PlacementRequest of options parsed by add_placement_options (or add_model_options alone)."""
    from stagevisor.supervisor.placement.request import PlacementRequest

    return PlacementRequest(
        args.model_path,
        args.config,
        getattr(args, "isolate_stage", ()),
        getattr(args, "stage_process", ()),
        getattr(args, "process_replicas", ()),
    )


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Validate the placement options parsed by add_placement_options; raises StagevisorError.

    With `--launcher ray` the cluster is joined and checked too (CLUSTER_LACKS), and this process stays
    joined: `serve` then runs its workers there.
    """
    from stagevisor.supervisor.placement.request import plan_placement

    plan = plan_placement(request_from_args(args))
    if getattr(args, "launcher", "local") == "ray":
        from stagevisor.supervisor.cluster.connect import check_plan_on_cluster

        check_plan_on_cluster(plan, args.ray_address)
    return plan


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
    plan.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    plan.add_argument(
        "--app-dir",
        type=app_dir,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory to look for stage factories' modules in (as with serve); repeatable",
    )
    plan.add_argument(
        "--explain",
        action="store_true",
        help="also show, for every setting of every stage, process group and the placement, where it came "
        "from: the built-in model, a YAML file and line, a CLI option, an edge's recommendation, or a default",
    )
    plan.set_defaults(handler=_run_plan)

    models = subparsers.add_parser(
        "models",
        help="list the built-in models and which of their stages may be split into processes",
        description=(
            "For each model: the paths that select it, its stages with their declared process, GPU and "
            "memory fraction, the process-safe edges, the fractions recommended when an edge is split, "
            "the unsupported edges with the reason they are unsafe, its role aliases, whether its executors are "
            "real or stand-ins, and the extra they need with whether it is installed here (and the command that "
            "installs it)."
        ),
        epilog=MODELS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    models.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    models.set_defaults(handler=_run_models)


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


def _share(group: str, fraction: float | None) -> str:
    """`group 0.85`, or `group -` for a group without a fraction."""
    return f"{group} {_number(fraction)}" if fraction is not None else f"{group} -"


def _number(value: float) -> str:
    return f"{round(value, 6):g}"


def render_plan(plan: Plan) -> str:
    """The table form: process groups padded to the longest name, then GPU totals, then warnings."""
    width = max(len(g.name) for g in plan.groups)
    lines = [f"{g.name.ljust(width)} : {', '.join(g.stages)}{_replicas_text(g)}" for g in plan.groups]
    lines.append("")
    by_group = {w.name: g for g in plan.groups for w in g.workers()}
    for gpu in plan.gpus:
        if all(by_group[name].total_gpu_memory_fraction is None for name in gpu.groups):
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


def _run_models(args: argparse.Namespace) -> int:
    from stagevisor.models.registry import builtin_models, third_party_models

    declarations = [(d, "builtin") for d in builtin_models()] + [(d, "plugin") for d in third_party_models()]
    if args.format == "json":
        print(json.dumps({"models": [model_facts(d, origin) for d, origin in declarations]}))
    else:
        print(render_models([model_facts(d, origin) for d, origin in declarations]))
    return 0


def _decimal(value: float) -> str:
    # Two decimals read like the spec's "0.03 / 0.85 / 0.10" unless that would lose digits.
    return f"{value:.2f}" if abs(round(value, 2) - value) < 1e-12 else _number(value)


def model_facts(
    declaration: Any, origin: str = "builtin", installed: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """What `stagevisor models` shows for one declaration: derived from it, and whether the extras its stages need
    are installed here (`installed`: whether a module is importable; default: look it up, importing nothing)."""
    from stagevisor.stages.extras import extras_needed

    pipeline = declaration.pipeline
    factories = [(s.name, s.factory or "") for s in pipeline.stages]
    needed = extras_needed(factories) if installed is None else extras_needed(factories, installed)
    gpu_stages = [s for s in pipeline.stages if s.gpus]
    if pipeline.process_edge_resources:
        recommendation = "; ".join(
            f"{r.edge[0]} -> {r.edge[1]}: " + ", ".join(f"{s} {_decimal(v)}" for s, v in r.fractions.items())
            for r in pipeline.process_edge_resources
        )
    elif not pipeline.process_safe_edges:
        recommendation = "-"
    elif not gpu_stages:
        recommendation = "none needed on CPU"
    elif all(s.fraction is not None for s in gpu_stages):
        recommendation = "none needed; the config already declares " + " / ".join(
            _decimal(s.fraction) for s in gpu_stages
        )
    else:
        recommendation = "none yet; declare fractions before splitting"
    unsupported = [
        {"edge": list(edge), "reason": declaration.reason_for(edge)} for edge in declaration.unsupported_edges()
    ]
    return {
        "key": declaration.key,
        "name": declaration.display_name,
        "origin": origin,
        "paths": list(declaration.paths),
        "architectures": list(declaration.architectures),
        "executors": _executors_text(declaration, origin),
        "stages": [
            {
                "name": s.name,
                "process": s.process,
                "gpu": list(s.gpu) if isinstance(s.gpu, tuple) else s.gpu,
                "tp_size": s.tp_size,
                "total_gpu_memory_fraction": s.fraction,
                "next": list(s.next),
                "stream_to": list(s.stream_to),
            }
            for s in pipeline.stages
        ],
        "process_safe_edges": [list(e) for e in pipeline.process_safe_edges],
        "recommended_fractions": [
            {"edge": list(r.edge), "fractions": dict(r.fractions)} for r in pipeline.process_edge_resources
        ],
        "recommendation": recommendation,
        "unsupported_edges": unsupported,
        "all_edges_unsupported": bool(unsupported) and not pipeline.process_safe_edges,
        "role_aliases": dict(pipeline.role_aliases),
        "description": declaration.description,
        "extras": [
            {
                "name": need.extra.name,
                "installed": not need.missing,
                "missing": list(need.missing),
                "install": need.extra.install_hint(),
            }
            for need in needed
        ],
    }


def _stage_text(stage: dict[str, Any]) -> str:
    where = "cpu" if stage["gpu"] is None else f"gpu {stage['gpu']}"
    fraction = "" if stage["total_gpu_memory_fraction"] is None else f", {_decimal(stage['total_gpu_memory_fraction'])}"
    return f"{stage['name']} ({stage['process']}, {where}{fraction})"


def _executors_text(declaration: Any, origin: str) -> str:
    if declaration.standin_executors:
        return "stand-in executors on the default voice, not the model's weights (served only with --stand-ins)"
    if origin == "builtin":
        return "real: the model's own weights"
    return "declared factories"


def _extra_text(extra: dict[str, Any]) -> str:
    if extra["installed"]:
        return f"{extra['name']} (installed)"
    return f"{extra['name']} (not installed here: {extra['install']})"


def render_models(facts: list[dict[str, Any]]) -> str:
    """One block per model: the applicability row plus stages, processes, aliases and executors."""
    blocks = []
    for f in facts:
        edges = lambda es: ", ".join(f"{a} -> {b}" for a, b in es) or "none"  # noqa: E731
        if f["all_edges_unsupported"]:
            reasons = {u["reason"] for u in f["unsupported_edges"]}
            unsupported = "all; " + "; ".join(sorted(r for r in reasons if r))
        else:
            unsupported = (
                "; ".join(
                    f"{u['edge'][0]} -> {u['edge'][1]}" + (f" ({u['reason']})" if u["reason"] else "")
                    for u in f["unsupported_edges"]
                )
                or "-"
            )
        rows = [
            ("key", f["key"]),
            ("paths", ", ".join(f["paths"]) or "(registry key only)"),
            ("architectures", ", ".join(f["architectures"]) or "-"),
            ("stages", " -> ".join(_stage_text(s) for s in f["stages"])),
            ("process-safe edges", edges(f["process_safe_edges"])),
            ("recommended fractions", f["recommendation"]),
            ("unsupported edges", unsupported),
            ("role aliases", ", ".join(f"{a} -> {t}" for a, t in f["role_aliases"].items()) or "-"),
            ("executors", f["executors"]),
            ("extras", "; ".join(_extra_text(e) for e in f["extras"]) or "-"),
        ]
        if f["description"]:
            rows.append(("about", f["description"]))
        title = f["name"] + (" (third-party)" if f["origin"] == "plugin" else "")
        blocks.append("\n".join([title] + [f"  {label + ':':<23}{value}" for label, value in rows]))
    return "\n\n".join(blocks)
