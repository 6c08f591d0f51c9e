"""`stagevisor models`: the built-in models, what each lets you split into processes, and what it needs here.

Imports only the model declarations: no grpc, numpy or torch, so it answers fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

from stagevisor.supervisor.commands.output_format import add_format_option
from stagevisor.supervisor.placement.wording import fraction_text


MODELS_EXAMPLES = """\
examples:
  stagevisor models
  stagevisor models --format json
"""


def register(subparsers: Any) -> None:
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
    add_format_option(models)
    models.set_defaults(handler=_run_models)


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
    return f"{value:.2f}" if abs(round(value, 2) - value) < 1e-12 else fraction_text(value)


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
