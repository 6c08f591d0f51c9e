"""Where each effective setting of a Plan came from: the model, a YAML line, a CLI option, an edge, or a default.

Pure, like the planner: it reads the same inputs `plan` reads (the model, the
YAML file, the placement options) and the Plan they produced, and traces every
stage, process group and placement setting back through the layers the
planner applies them in: the built-in declaration (or a pipeline declared in
full), the YAML overrides, the CLI options, then the fractions an edge's split
recommends. A value no layer set is the schema's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from pydantic import BaseModel

from stagevisor.supervisor.config import (
    ConfigFile,
    PipelineConfig,
    PlacementConfig,
    ProcessConfig,
    config_key_lines,
    load_config,
)
from stagevisor.supervisor.errors import KeyPath
from stagevisor.supervisor.placement.options import parse_assignments, parse_replica_options, resolve_stage
from stagevisor.supervisor.placement.planner import resolve_declaration
from stagevisor.supervisor.plan import Plan

SourceKind = Literal["model", "yaml", "cli", "recommended", "derived", "default"]

STAGE_KEYS = ("process", "gpu", "tp_size", "factory", "next", "stream_to")
"""StageConfig fields explained one row each; `args` is explained key by key, the fraction on its own row."""
FRACTION = "total_gpu_memory_fraction"
FRACTION_PATH = ("runtime", "resources", FRACTION)


@dataclass(frozen=True)
class Source:
    """Where one value came from: its kind and, for an operator, the exact place."""

    kind: SourceKind
    where: str


@dataclass(frozen=True)
class Setting:
    """One effective setting: `subject` (a stage, a process group, the placement or the model), its key and value."""

    subject: str
    key: str
    value: Any
    source: Source

    def to_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "key": self.key,
            "value": _jsonable(self.value),
            "source": self.source.kind,
            "where": self.source.where,
        }


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


class _Lines:
    """Key paths of the YAML file -> `FILE line N` (or just the file where the key path is not written)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lines: Mapping[KeyPath, int] = config_key_lines(path) if path else {}

    def at(self, *key: Any) -> Source:
        line = self.lines.get(tuple(key))
        return Source("yaml", f"{self.path} line {line}" if line else str(self.path))


def explain(
    model_path: str | None,
    config_path: str | None,
    plan: Plan,
    isolate_stages: Sequence[str] = (),
    stage_processes: Sequence[str] = (),
    process_replicas: Sequence[str] = (),
) -> tuple[Setting, ...]:
    """Every effective setting of `plan` with its source, in the order: model, placement, stages, groups."""
    config = load_config(config_path) if config_path else None
    lines = _Lines(config_path)
    if config is not None and config.pipeline is not None:
        declared = config.pipeline
        sources = _full_pipeline_sources(declared, lines)
        model = Setting("model", "name", declared.name, lines.at("pipeline", "name"))
    else:
        declaration = resolve_declaration(model_path, config, config_path)
        declared = declaration.pipeline
        sources = _declaration_sources(declared, f"built-in {declaration.key}")
        if config is not None:
            declared = _overlay_yaml(declared, config, sources, lines)
        model = Setting("model", "name", declaration.key, _model_source(model_path, config, lines))
    _overlay_cli(declared, plan, sources, isolate_stages, stage_processes)
    _overlay_recommendations(declared, plan, sources)
    settings = [model, *_placement_settings(config, lines)]
    by_stage = {s.name: s for s in plan.stages}
    for stage in declared.stages:
        planned = by_stage[stage.name]
        subject = f"stage {stage.name}"
        values = {
            "process": planned.process,
            "gpu": planned.gpu,
            "tp_size": planned.tp_size,
            "factory": planned.factory,
            "next": planned.next,
            "stream_to": planned.stream_to,
        }
        for key in STAGE_KEYS:
            settings.append(Setting(subject, key, values[key], sources[(stage.name, key)]))
        for arg, value in planned.args.items():
            settings.append(Setting(subject, f"args.{arg}", value, sources[(stage.name, f"args.{arg}")]))
        settings.append(Setting(subject, FRACTION, planned.total_gpu_memory_fraction, sources[(stage.name, FRACTION)]))
    settings += _group_settings(plan, config, lines, process_replicas)
    return tuple(settings)


def _model_source(model_path: str | None, config: ConfigFile | None, lines: _Lines) -> Source:
    if model_path is not None:
        return Source("cli", f"--model-path {model_path}")
    if config is not None and config.model_path is not None:
        return lines.at("model_path")
    return Source("default", "no model named: the embedded default")


def _declaration_sources(pipeline: PipelineConfig, where: str) -> dict[tuple[str, str], Source]:
    """A built-in declaration: the fields it sets come from the model, the rest are defaults."""
    sources: dict[tuple[str, str], Source] = {}
    model, default = Source("model", where), Source("default", "schema default")
    for stage in pipeline.stages:
        for key in STAGE_KEYS:
            sources[(stage.name, key)] = model if key in stage.model_fields_set else default
        for arg in stage.args:
            sources[(stage.name, f"args.{arg}")] = model
        declared = stage.fraction is not None
        sources[(stage.name, FRACTION)] = model if declared else default
    return sources


def _full_pipeline_sources(pipeline: PipelineConfig, lines: _Lines) -> dict[tuple[str, str], Source]:
    """A pipeline declared in full in YAML: each written field from its line, the rest defaults."""
    sources: dict[tuple[str, str], Source] = {}
    default = Source("default", "schema default")
    for index, stage in enumerate(pipeline.stages):
        at = ("pipeline", "stages", index)
        for key in STAGE_KEYS:
            sources[(stage.name, key)] = lines.at(*at, key) if key in stage.model_fields_set else default
        for arg in stage.args:
            sources[(stage.name, f"args.{arg}")] = lines.at(*at, "args", arg)
        sources[(stage.name, FRACTION)] = lines.at(*at, *FRACTION_PATH) if stage.fraction is not None else default
    return sources


def _overlay_yaml(
    pipeline: PipelineConfig, config: ConfigFile, sources: dict[tuple[str, str], Source], lines: _Lines
) -> PipelineConfig:
    """Record the YAML overrides' sources; return the merged pipeline, as the planner merges it."""
    from stagevisor.supervisor.config import merge_overrides

    for index, override in enumerate(config.stages):
        at = ("stages", index)
        for key in override.model_fields_set - {"name"}:
            if key == "args":
                for arg in override.args or {}:
                    sources[(override.name, f"args.{arg}")] = lines.at(*at, "args", arg)
            elif key == "runtime":
                if override.runtime is not None and FRACTION in override.runtime.resources.model_fields_set:
                    sources[(override.name, FRACTION)] = lines.at(*at, *FRACTION_PATH)
            else:
                sources[(override.name, key)] = lines.at(*at, key)
    return merge_overrides(pipeline, config.stages, str(lines.path)) if config.stages else pipeline


def _overlay_cli(
    pipeline: PipelineConfig,
    plan: Plan,
    sources: dict[tuple[str, str], Source],
    isolate_stages: Sequence[str],
    stage_processes: Sequence[str],
) -> None:
    """A stage whose process the options changed takes its process from the option that names it."""
    by_stage = {s.name: s for s in plan.stages}
    for assignment in parse_assignments(isolate_stages, stage_processes):
        stage = resolve_stage(pipeline, assignment.stage, assignment.option)
        declared = pipeline.stage(stage)
        if by_stage[stage].process != (declared.process or declared.name):
            sources[(stage, "process")] = Source("cli", assignment.option)


def _overlay_recommendations(pipeline: PipelineConfig, plan: Plan, sources: dict[tuple[str, str], Source]) -> None:
    """A fraction the planner filled in names the split edge that recommends it."""
    crossing = {(e.src, e.dst) for e in plan.edges if e.cross_process}
    for stage in plan.stages:
        if stage.fraction_source != "recommended":
            continue
        edges = [
            r.edge
            for r in pipeline.process_edge_resources
            if r.edge in crossing
            and stage.name in r.fractions
            and stage.total_gpu_memory_fraction is not None
            and abs(r.fractions[stage.name] - stage.total_gpu_memory_fraction) < 1e-9
        ]
        text = " and ".join(f"'{src}' -> '{dst}'" for src, dst in edges)
        sources[(stage.name, FRACTION)] = Source("recommended", f"recommended by the model when {text} is split")


def _placement_settings(config: ConfigFile | None, lines: _Lines) -> list[Setting]:
    placement = config.placement if config is not None else PlacementConfig()
    written = config.placement.model_fields_set if config is not None else set()
    return [
        Setting(
            "placement",
            key,
            getattr(placement, key),
            lines.at("placement", key) if key in written else Source("default", "schema default"),
        )
        for key in PlacementConfig.model_fields
    ]


def _group_settings(
    plan: Plan, config: ConfigFile | None, lines: _Lines, process_replicas: Sequence[str]
) -> list[Setting]:
    processes: dict[str, ProcessConfig] = dict(config.processes) if config is not None else {}
    options = {r.process: r.origin for r in parse_replica_options(process_replicas)}
    settings: list[Setting] = []
    for group in plan.groups:
        subject = f"group {group.name}"
        derived_from = f"the stages placed in process {group.name}"
        settings.append(Setting(subject, "stages", group.stages, Source("derived", derived_from)))
        settings.append(Setting(subject, "gpu", group.gpu, Source("derived", f"the gpu of {derived_from}")))
        settings.append(
            Setting(
                subject,
                FRACTION,
                group.total_gpu_memory_fraction,
                Source("derived", f"the sum of the fractions of {derived_from}"),
            )
        )
        written = processes.get(group.name)
        settings.append(
            Setting(
                subject, "replicas", group.replicas, _process_source(group.name, "replicas", written, lines, options)
            )
        )
        settings.append(
            Setting(subject, "gpus", group.spread_gpus, _process_source(group.name, "gpus", written, lines))
        )
        settings.append(Setting(subject, "node", group.node, _process_source(group.name, "node", written, lines)))
        settings += _autoscale_settings(subject, group.name, group.autoscale, written, lines)
    return settings


def _autoscale_settings(
    subject: str, name: str, bounds: Any, written: ProcessConfig | None, lines: _Lines
) -> list[Setting]:
    """One row per autoscale field when the group autoscales (from its YAML line, or the schema default)."""
    if bounds is None or written is None or written.autoscale is None:
        return [Setting(subject, "autoscale", None, Source("default", "schema default"))]
    given = written.autoscale.model_fields_set
    return [
        Setting(
            subject,
            f"autoscale.{key}",
            value,
            lines.at("processes", name, "autoscale", key) if key in given else Source("default", "schema default"),
        )
        for key, value in bounds.to_json().items()
    ]


def _process_source(
    name: str, key: str, written: BaseModel | None, lines: _Lines, options: Mapping[str, str] | None = None
) -> Source:
    if options and name in options:
        return Source("cli", options[name])
    if written is not None and key in written.model_fields_set:
        return lines.at("processes", name, key)
    return Source("default", "schema default")


def render_explain(settings: Sequence[Setting]) -> str:
    """The table form: one row per setting, columns padded: subject, setting, value, source."""
    rows = [("SUBJECT", "SETTING", "VALUE", "SOURCE")]
    for s in settings:
        rows.append((s.subject, s.key, _value_text(s.value), f"{s.source.kind}: {s.source.where}"))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows)


def _value_text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)
