"""The one planning entry point: a PlacementRequest (model, config file, placement options) -> a Plan. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from stagevisor.supervisor.config import (
    ConfigFile,
    PipelineConfig,
    SourcedConfig,
    SpeechConfig,
    load_config,
    load_config_source,
    merge_overrides,
    parse_config_source,
)
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, StagevisorError
from stagevisor.supervisor.placement.nodes import apply_process_nodes
from stagevisor.supervisor.placement.options import parse_replica_options, replica_requests
from stagevisor.supervisor.placement.planner import apply_autoscale, plan_pipeline, resolve_declaration
from stagevisor.supervisor.plan import Plan


@dataclass(frozen=True)
class PlacementRequest:
    """What an operator asks of placement, as `plan`, `serve`, `check` and `bench` take it on the command line.

    Fields hold the options' raw text (`STAGE=GROUP`, `GROUP=N`): parsing and every check happen in
    plan_placement, so a malformed option fails there with its code. Sequences are stored as tuples.
    """

    model_path: str | None = None
    """--model-path: a registry key, an HF-style path or a local directory; None: the config's, else the default."""
    config_path: str | None = None
    """--config: a YAML file (a built-in model with overrides, or a pipeline in full)."""
    isolate_stages: tuple[str, ...] = ()
    """--isolate-stage STAGE, in the order given."""
    stage_processes: tuple[str, ...] = ()
    """--stage-process STAGE=GROUP, in the order given."""
    process_replicas: tuple[str, ...] = ()
    """--process-replicas GROUP=N, in the order given."""
    config_text: str | None = None
    """The config's YAML text when it travels without its file (`stagevisor apply` sends it to the daemon);
    `config_path` then only names it in messages."""

    def __post_init__(self) -> None:
        for name in ("isolate_stages", "stage_processes", "process_replicas"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"PlacementRequest.{name} takes a sequence of option values, not one string")
            object.__setattr__(self, name, tuple(value))

    def options(self) -> list[str]:
        """The placement options in the `plan` syntax (without the model and config)."""
        argv: list[str] = []
        argv += [arg for stage in self.isolate_stages for arg in ("--isolate-stage", stage)]
        argv += [arg for item in self.stage_processes for arg in ("--stage-process", item)]
        argv += [arg for item in self.process_replicas for arg in ("--process-replicas", item)]
        return argv

    def argv(self) -> list[str]:
        """The whole request as `plan` / `serve` options: the model, the config, then options()."""
        return [
            *(["--model-path", self.model_path] if self.model_path is not None else []),
            *(["--config", self.config_path] if self.config_path is not None else []),
            *self.options(),
        ]

    def is_declared(self) -> bool:
        """True when the request carries no placement option (the model's own topology is asked for)."""
        return not (self.isolate_stages or self.stage_processes or self.process_replicas)


def named_model_paths(request: PlacementRequest) -> list[tuple[str, str]]:
    """(where, model path) for each model path `request` names: its --model-path, then its config's `model_path`
    (the config parsed, never a model path resolved). A config that does not parse names none: plan_placement
    reports it."""
    named = [("--model-path", request.model_path)] if request.model_path is not None else []
    config = _parsed_config(request)
    if config is not None and config.model_path is not None:
        named.append((f"{request.config_path or 'the config'}'s model_path", config.model_path))
    return named


def replica_counts_given(request: PlacementRequest) -> frozenset[str]:
    """The process groups whose replica count `request` sets: by --process-replicas, or a config's
    `processes.<name>.replicas` written out (not its default). Malformed options and configs set none: plan_placement
    reports them."""
    try:
        given = {option.process for option in parse_replica_options(request.process_replicas)}
    except StagevisorError:
        given = set()
    config = _parsed_config(request)
    processes = config.processes if config is not None else {}
    return frozenset(given | {name for name, settings in processes.items() if "replicas" in settings.model_fields_set})


def _parsed_config(request: PlacementRequest) -> ConfigFile | None:
    """The request's config, or None without one or when it does not parse."""
    try:
        if request.config_text is not None:
            return parse_config_source(request.config_text, str(request.config_path or "<config>")).config
        return load_config_source(request.config_path).config if request.config_path else None
    except StagevisorError:
        return None


def plan_placement(request: PlacementRequest) -> Plan:
    """Validate a request and return its Plan (node pins applied); raises ConfigError or PlacementError.

    The config file is read once. Pure: nothing is started and no cluster is asked (a Ray launcher checks
    the plan against its cluster afterwards). An error about an entry of the config file starts with the
    entry's `file:line:column`.
    """
    sourced: SourcedConfig | None
    if request.config_text is not None:
        sourced = parse_config_source(request.config_text, str(request.config_path or "<config>"))
    else:
        sourced = load_config_source(request.config_path) if request.config_path else None
    if sourced is None:
        return apply_autoscale(_plan(request, None), None, str(request.config_path))
    config = sourced.config
    try:
        plan = apply_autoscale(_plan(request, config), config, str(request.config_path))
        return apply_process_nodes(plan, config)
    except StagevisorError as error:
        raise sourced.locations.locate(error) from None


def _plan(request: PlacementRequest, config: ConfigFile | None) -> Plan:
    source = str(request.config_path)
    replicas = replica_requests(config, source, request.process_replicas)
    if config is not None and config.pipeline is not None:
        if request.model_path is not None:
            raise ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"{source}: the pipeline is declared in full (`pipeline:`), so --model-path "
                f"{request.model_path!r} has nothing to select; drop --model-path (pass weights to your "
                "factories through `args`)",
                config_path=("pipeline",),
            )
        try:
            return plan_pipeline(
                config.pipeline,
                placement=config.placement,
                isolate_stages=request.isolate_stages,
                stage_processes=request.stage_processes,
                model=config.pipeline.name,
                source=source,
                replicas=replicas,
            )
        except StagevisorError as error:
            raise _in_file(error, lambda path: ("pipeline", *path)) from None
    declaration = resolve_declaration(request.model_path, config, request.config_path)
    pipeline = declaration.pipeline
    if config is not None and config.stages:
        pipeline = merge_overrides(pipeline, config.stages, source)
    model_path = request.model_path if request.model_path is not None else (config.model_path if config else None)
    try:
        plan = plan_pipeline(
            pipeline,
            baseline=declaration.pipeline,
            placement=config.placement if config else None,
            isolate_stages=request.isolate_stages,
            stage_processes=request.stage_processes,
            model=declaration.key,
            model_path=model_path,
            unsafe_reasons={e: declaration.reason_for(e) or "" for e in declaration.unsupported_edges()},
            runtime_fraction_args=declaration.runtime_fraction_args,
            source=source if request.config_path else declaration.key,
            replicas=replicas,
        )
    except StagevisorError as error:
        raise _in_file(error, lambda path: _override_path(pipeline, config, path)) from None
    return replace(plan, preload=declaration.preload())


def _in_file(error: StagevisorError, placed: Callable[[KeyPath], KeyPath]) -> StagevisorError:
    """A planner error with its config path made a path in the file.

    The planner names entries of the pipeline it checked (`("stages", 2, "next")`) and, for replica
    requests, entries of the file itself (`("processes", "vocoder")`); `placed` says where the pipeline's
    entries are written.
    """
    path = error.config_path
    if not path or path[0] not in PipelineConfig.model_fields:
        return error
    return error.about(placed(path))


def _override_path(pipeline: PipelineConfig, config: ConfigFile | None, path: KeyPath) -> KeyPath:
    """A path within a model's merged pipeline as a path in the config file: a stage's entry is its override
    under `stages` (merged by name); what no override wrote came from the model's declaration, not the file."""
    if config is None or len(path) < 2 or path[0] != "stages" or not isinstance(path[1], int):
        return ()
    name = pipeline.stages[path[1]].name
    index = next((i for i, override in enumerate(config.stages) if override.name == name), None)
    if index is None or (len(path) > 2 and path[2] not in config.stages[index].model_fields_set):
        return ()
    return ("stages", index, *path[2:])


def hub_ids(model_path: str | None, config_path: str | None) -> tuple[str, ...]:
    """The served model's hub ids (its declaration's `paths`); none for a pipeline declared in full."""
    config = load_config(config_path) if config_path else None
    if config is not None and config.pipeline is not None:
        return ()
    return resolve_declaration(model_path, config, config_path).paths


def voice_names(request: PlacementRequest) -> dict[str, str] | None:
    """The `voices` map of the request's config (the names clients may send -> the model's voices; empty where the
    config has none), None without a config. Read from its text where the request carries one (an apply's)."""
    if request.config_text is not None:
        return dict(parse_config_source(request.config_text, str(request.config_path or "<config>")).config.voices)
    if request.config_path is not None:
        return dict(load_config(request.config_path).voices)
    return None


def speech_config(model_path: str | None, config_path: str | None) -> SpeechConfig:
    """What the served model takes in a speech request: a full pipeline's `speech`, else its declaration's (for the
    checkpoint the model path names, where the model's checkpoints differ)."""
    config = load_config(config_path) if config_path else None
    if config is not None and config.pipeline is not None:
        return config.pipeline.speech
    declaration = resolve_declaration(model_path, config, config_path)
    return declaration.speech(model_path if model_path is not None else (config.model_path if config else None))
