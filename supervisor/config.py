"""Pipeline configuration: the YAML schema, safe loading, and merging overrides onto a model.

Pure: takes text or data, returns frozen pydantic objects or raises ConfigError.
Every override yields a new object; a declaration is never mutated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from stagevisor.supervisor.config_locations import ConfigLocations, dotted, mark_location, node_locations
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, Problem, clipped, shown

# Stage and process names end up in group names, socket paths and log lines,
# so they are kept to a conservative identifier alphabet.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__} {shown(value)}")
    if not NAME_PATTERN.match(value):
        raise ValueError(
            f"{what} {shown(value)} is not a valid name: use letters, digits, '_', '.', '-' "
            "and start with a letter or digit"
        )
    return value


def check_fraction(value: Any, what: str = "total_gpu_memory_fraction") -> float | None:
    """A GPU memory fraction: a real number in (0, 1]; None means undeclared."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number in (0, 1], got {type(value).__name__} {shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        # An integer too large for a float is far outside (0, 1] anyway.
        raise ValueError(f"{what} must be in (0, 1], got an integer too large for a number") from None
    if math.isnan(number):
        raise ValueError(f"{what} must be a number in (0, 1], got NaN")
    if not 0.0 < number <= 1.0:
        raise ValueError(f"{what} must be in (0, 1], got {shown(number)}")
    return number


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ResourcesConfig(_Frozen):
    """GPU resources a stage declares for placement accounting."""

    total_gpu_memory_fraction: float | None = Field(
        None, description="Share of its GPU's memory this stage may use, in (0, 1]; None = undeclared."
    )

    @field_validator("total_gpu_memory_fraction", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> float | None:
        return check_fraction(value)


class RuntimeConfig(_Frozen):
    """Runtime settings of a stage."""

    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="GPU resources the stage declares for placement."
    )


def _as_names(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} must be a stage name or a list of stage names, got {shown(value)}")
    names = tuple(_check_name(v, f"{what} entry") for v in value)
    for index, name in enumerate(names):
        if name in names[:index]:
            # A repeated target would deliver every payload to it twice.
            raise ValueError(f"{what} lists stage {shown(name)} twice; name each target once")
    return names


class _StageChecks(_Frozen):
    """Field checks shared by a full stage entry and a partial override, so both read the same."""

    @field_validator("name", mode="before", check_fields=False)
    @classmethod
    def _name(cls, value: Any) -> str:
        return _check_name(value, "stage name")

    @field_validator("process", mode="before", check_fields=False)
    @classmethod
    def _process(cls, value: Any) -> str | None:
        return None if value is None else _check_name(value, "process")

    @field_validator("factory", mode="before", check_fields=False)
    @classmethod
    def _factory(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not re.match(r"^[\w.]+:[\w.]+$", value):
            raise ValueError(f"factory must be an import path 'module:callable', got {shown(value)}")
        return value

    @field_validator("args", mode="before", check_fields=False)
    @classmethod
    def _args(cls, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"args must be a mapping of keyword arguments, got {shown(value)}")
        return dict(value)

    @field_validator("gpu", mode="before", check_fields=False)
    @classmethod
    def _gpu(cls, value: Any) -> int | tuple[int, ...] | None:
        def one(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"gpu must be null, a GPU id (int >= 0) or a list of them, got {shown(value)}")
            return v

        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            if not value:
                raise ValueError("gpu must not be an empty list; use null for a CPU stage")
            return tuple(one(v) for v in value)
        return one(value)

    @field_validator("tp_size", mode="before", check_fields=False)
    @classmethod
    def _tp_size(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"tp_size must be an integer >= 1, got {shown(value)}")
        return value

    @field_validator("next", "stream_to", mode="before", check_fields=False)
    @classmethod
    def _edges(cls, value: Any, info: Any) -> tuple[str, ...]:
        return _as_names(value, info.field_name)


class StageConfig(_StageChecks):
    """One stage of a pipeline: what builds it, where it runs, and where its output goes."""

    name: str = Field(description="Unique stage name within the pipeline.")
    factory: str | None = Field(None, description="Import path `module:callable` building the executor.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the factory.")
    process: str | None = Field(None, description="Process group name; required when tp_size == 1.")
    gpu: int | tuple[int, ...] | None = Field(
        None, description="None = CPU stage; a GPU id; a list of GPU ids (one per rank) when tp_size > 1."
    )
    tp_size: int = Field(1, ge=1, description="Tensor-parallel ranks; each rank runs in its own process.")
    next: tuple[str, ...] = Field((), description="Stages that receive this stage's final payload.")
    stream_to: tuple[str, ...] = Field((), description="`next` stages that also receive streamed chunks.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig, description="Runtime settings: `resources`.")

    @property
    def fraction(self) -> float | None:
        return self.runtime.resources.total_gpu_memory_fraction

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPU ids this stage uses (empty for a CPU stage)."""
        if self.gpu is None:
            return ()
        return self.gpu if isinstance(self.gpu, tuple) else (self.gpu,)

    def with_fraction(self, fraction: float | None) -> "StageConfig":
        """A copy carrying a different declared fraction."""
        runtime = RuntimeConfig(resources=ResourcesConfig(total_gpu_memory_fraction=fraction))
        return self.model_copy(update={"runtime": runtime}, deep=True)


EdgeName = tuple[str, str]


class EdgeResources(_Frozen):
    """Fractions a model recommends when an edge is split across processes on a shared GPU."""

    edge: tuple[StrictStr, StrictStr] = Field(description="The edge [src, dst] these fractions are for.")
    fractions: dict[str, float] = Field(
        description="Stage name -> recommended total_gpu_memory_fraction, each in (0, 1]."
    )

    @field_validator("fractions", mode="before")
    @classmethod
    def _fractions(cls, value: Any) -> dict[str, float | None]:  # pydantic then refuses a null fraction
        if not isinstance(value, Mapping) or not value:
            raise ValueError(f"fractions must be a non-empty mapping of stage -> fraction, got {shown(value)}")
        return {_check_name(k, "stage"): check_fraction(v, f"fraction of {shown(k)}") for k, v in value.items()}


OPTION_TYPES = ("number", "integer", "boolean", "string")


class OptionSpec(_Frozen):
    """One model-specific request option (e.g. noise_scale): its type, bounds and meaning."""

    type: str = Field("number", description="One of number, integer, boolean, string.")
    minimum: float | None = Field(None, description="Smallest value accepted (numbers).")
    maximum: float | None = Field(None, description="Largest value accepted (numbers).")
    description: str = Field("", description="What the option changes, shown at GET /v1/models.")

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value not in OPTION_TYPES:
            raise ValueError(f"option type {shown(value)} is not one of {', '.join(OPTION_TYPES)}")
        return value

    @model_validator(mode="after")
    def _bounds(self) -> "OptionSpec":
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum:g} is above maximum {self.maximum:g}")
        return self


class SpeechConfig(_Frozen):
    """What a model takes in a speech request beyond text and voice; the HTTP API checks and lists it."""

    clones: StrictBool = Field(
        False, description="The model conditions on reference audio (ref_audio/ref_text, uploaded voices)."
    )
    instructions: StrictBool = Field(
        False, description="The model follows `instructions` (where false, its stages ignore or refuse them)."
    )
    seed: StrictBool = Field(False, description="The model takes a `seed` for its sampling.")
    languages: tuple[StrictStr, ...] = Field((), description="Values `language` may take; empty: not selectable.")
    options: dict[str, OptionSpec] | None = Field(
        None,
        description="Model-specific options by name; null: any option is passed to the stages, which check it.",
    )

    @field_validator("options", mode="before")
    @classmethod
    def _option_names(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            for name in value:
                _check_name(name, "option")
        return value


class PipelineConfig(_Frozen):
    """A pipeline: stages in order, plus what the model declares about splitting them."""

    name: str = Field(description="Pipeline name (the model key for built-in models).")
    stages: tuple[StageConfig, ...] = Field(min_length=1, description="The stages, in order; at least one.")
    process_safe_edges: tuple[tuple[StrictStr, StrictStr], ...] = Field(
        (), description="Edges [src, dst] whose handoff stays correct across a process boundary."
    )
    process_edge_resources: tuple[EdgeResources, ...] = Field(
        (), description="Recommended fractions applied when a placement option newly splits an edge."
    )
    role_aliases: dict[str, str] = Field(
        default_factory=dict, description="Stable role name -> this pipeline's stage name (e.g. vocoder)."
    )
    speech: SpeechConfig = Field(
        default_factory=SpeechConfig, description="What the model takes in a speech request (GET /v1/models)."
    )

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        return _check_name(value, "pipeline name")

    @field_validator("role_aliases", mode="before")
    @classmethod
    def _aliases(cls, value: Any) -> dict[str, str]:
        # A role is typed on the command line like a stage name, so both sides
        # use the stage-name alphabet; whether the target exists is a
        # structure check, made once all stages are known.
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"role_aliases must be a mapping of role -> stage name, got {shown(value)}")
        return {
            _check_name(k, "role alias"): _check_name(v, f"target of role alias {shown(k)}") for k, v in value.items()
        }

    def stage(self, name: str) -> StageConfig:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    @property
    def stage_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def links(self) -> tuple[EdgeName, ...]:
        """Every (src, dst) handoff, in stage order."""
        return tuple((s.name, dst) for s in self.stages for dst in s.next)


class PlacementConfig(_Frozen):
    """Placement limits applied to every GPU."""

    max_total_gpu_memory_fraction_per_gpu: float = Field(
        1.0, description="The most the fractions of all processes on one GPU may add up to, in (0, 1]."
    )
    strict_runtime_fractions: StrictBool = Field(
        False,
        description="True: an engine memory argument in a stage's `args` that disagrees with the stage's "
        "placement fraction is a RUNTIME_FRACTION_MISMATCH error instead of a warning.",
    )

    @field_validator("max_total_gpu_memory_fraction_per_gpu", mode="before")
    @classmethod
    def _limit(cls, value: Any) -> float:
        checked = check_fraction(value, "max_total_gpu_memory_fraction_per_gpu")
        if checked is None:
            raise ValueError("max_total_gpu_memory_fraction_per_gpu must be a number in (0, 1], got null")
        return checked


class StageOverride(_StageChecks):
    """A partial stage entry in the built-in-model YAML form; only the fields given change."""

    name: str = Field(description="The name of the model's stage to change.")
    factory: str | None = Field(None, description="Replaces the stage's factory (`module:callable`).")
    args: dict[str, Any] | None = Field(None, description="Replaces the factory's keyword arguments.")
    process: str | None = Field(None, description="Moves the stage to this process group.")
    gpu: int | tuple[int, ...] | None = Field(None, description="Replaces the stage's GPU (see StageConfig).")
    tp_size: int | None = Field(None, description="Replaces the stage's tensor-parallel rank count.")
    next: tuple[str, ...] | None = Field(None, description="Not allowed: a model's edges cannot be overridden.")
    stream_to: tuple[str, ...] | None = Field(None, description="Not allowed: a model's edges cannot be overridden.")
    runtime: RuntimeConfig | None = Field(None, description="Replaces the stage's runtime settings.")

    @model_validator(mode="before")
    @classmethod
    def _no_edges(cls, data: Any) -> Any:
        # A model's edges are what its process-safe edges and recommendations
        # are declared against; rewriting them here would slip a split past
        # the unsafe-edge check. The factory stays overridable: that is how a
        # deployment plugs real executors into a built-in topology.
        if isinstance(data, Mapping):
            for field in ("next", "stream_to"):
                if field in data:
                    raise ValueError(
                        f"`{field}` cannot be overridden: a model's edges are part of its declaration; "
                        "declare the pipeline in full under `pipeline:` to change them"
                    )
        return data


MAX_REPLICAS = 64
"""The most replicas one process group may run; far above what one host's cores or GPUs serve."""


def check_replicas(value: Any, what: str = "replicas") -> int:
    """A replica count: an integer in [1, MAX_REPLICAS]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{what} must be an integer from 1 to {MAX_REPLICAS}, got {type(value).__name__} {shown(value)}"
        )
    if not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{what} must be from 1 to {MAX_REPLICAS}, got {shown(value)}")
    return value


class AutoscaleConfig(_Frozen):
    """Autoscaling of one process group's replicas on the speech signals the daemon measures."""

    min_replicas: int = Field(1, description="The fewest replicas the autoscaler keeps, from 1.")
    max_replicas: int = Field(description=f"The most replicas the autoscaler starts, up to {MAX_REPLICAS}.")
    target_first_audio_p90_seconds: float = Field(
        1.0, gt=0, le=600, description="Scale up while the p90 time to first audio over the window is above this."
    )
    target_stall_p90_seconds: float | None = Field(
        None,
        ge=0,
        le=600,
        description="Scale up while the p90 playback stall over the window is above this; "
        "unset: stalls are not a signal.",
    )
    max_in_flight_per_replica: float = Field(
        4.0, gt=0, le=10_000, description="Scale up while the group holds more requests than this per replica."
    )
    scale_down_ratio: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Scale down only once every signal is below this share of its target "
        "(the gap between the two thresholds keeps the count from flapping).",
    )
    scale_up_cooldown_seconds: float = Field(
        5.0, ge=0, le=3600, description="The least time between a change and the next scale-up."
    )
    scale_down_cooldown_seconds: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="How long the signals must stay low, and the least time since the last "
        "change, before one replica is removed.",
    )
    window_seconds: float = Field(
        10.0, gt=0, le=600, description="The span of recent requests the first-audio and stall p90s are taken over."
    )

    @field_validator("min_replicas", "max_replicas", mode="before")
    @classmethod
    def _count(cls, value: Any, info: Any) -> int:
        return check_replicas(value, info.field_name)

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscaleConfig":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}; "
                "give min_replicas <= max_replicas"
            )
        return self


class ProcessConfig(_Frozen):
    """Settings of one process group, keyed by its process name under `processes:`."""

    replicas: int = Field(1, description="Worker processes that each run the whole group (data parallel).")
    gpus: tuple[int, ...] | None = Field(
        None,
        description="GPUs the replicas of a GPU group spread over, round robin from the GPU its stages "
        "declare, which must be listed; unset: every replica on that GPU.",
    )
    node: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="With `serve --launcher ray`: the Ray resource of the node(s) to run on (a custom resource "
        "or Ray's `node:<ip>`); unset: any node that fits. The local launcher ignores it.",
    )
    autoscale: AutoscaleConfig | None = Field(
        None,
        description="Let the daemon change this group's replicas between bounds on its speech signals; "
        "unset: replicas change only by `stagevisor scale`.",
    )

    @model_validator(mode="after")
    def _replicas_within_autoscale(self) -> "ProcessConfig":
        bounds = self.autoscale
        if bounds is not None and "replicas" in self.model_fields_set:
            if not bounds.min_replicas <= self.replicas <= bounds.max_replicas:
                raise ValueError(
                    f"replicas {self.replicas} is outside autoscale's bounds "
                    f"[{bounds.min_replicas}, {bounds.max_replicas}]; drop replicas or widen the bounds"
                )
        return self

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas(cls, value: Any) -> int:
        return check_replicas(value)

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: Any) -> tuple[int, ...] | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if (
            not isinstance(value, (list, tuple))
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        ):
            raise ValueError(f"gpus must be a non-empty list of GPU ids (int >= 0), got {shown(value)}")
        if len(set(value)) != len(value):
            raise ValueError(f"gpus lists a GPU twice: {shown(value)}")
        return tuple(value)


class ConfigFile(_Frozen):
    """The YAML file: either `model_path` + `stages` overrides, or a `pipeline` declared in full."""

    model_path: str | None = Field(
        None, description="A built-in model: its key, one of its paths, or a local directory with a config.json."
    )
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Limits applied to every GPU.")
    stages: tuple[StageOverride, ...] = Field(
        (), description="Changes to the model's stages, merged by name; only the fields given change."
    )
    pipeline: PipelineConfig | None = Field(
        None, description="A pipeline declared in full, instead of `model_path` and `stages`."
    )
    processes: dict[str, ProcessConfig] = Field(
        default_factory=dict, description="Per process group settings (replicas), keyed by process name."
    )
    voices: dict[str, str] = Field(
        default_factory=dict,
        description="Voice names clients may send -> the model's voice they stand for, e.g. {alloy: heart}; "
        "overrides the default map of OpenAI's voice names.",
    )

    @field_validator("voices", mode="before")
    @classmethod
    def _voices(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"voices must be a mapping of voice name -> the model's voice, got {shown(value)}")
        for name, target in value.items():
            _check_name(name, "voice name")
            _check_name(target, f"voice that {shown(name)} stands for")
        return value

    @field_validator("processes", mode="before")
    @classmethod
    def _processes(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"processes must be a mapping of process name to settings, got {shown(value)}")
        for name in value:
            _check_name(name, "process")
        return value


def merge_overrides(pipeline: PipelineConfig, overrides: tuple[StageOverride, ...], source: str) -> PipelineConfig:
    """Merge stage overrides onto a model's pipeline by stage name, returning a new pipeline.

    Only the fields an override gives change; `args` and `runtime.resources`
    merge key by key, every other field is replaced.
    """
    by_name = {s.name: s for s in pipeline.stages}
    seen: set[str] = set()
    merged: dict[str, StageConfig] = dict(by_name)
    for index, override in enumerate(overrides):
        if override.name not in by_name:
            raise ConfigError(
                ErrorCode.UNKNOWN_STAGE,
                f"{source}: stage {override.name!r} is not a stage of model {pipeline.name!r}; "
                f"its stages are {', '.join(repr(n) for n in pipeline.stage_names)}",
                stages=[override.name],
                config_path=("stages", index, "name"),
            )
        if override.name in seen:
            raise ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"{source}: stage {override.name!r} is listed twice under stages; merge the two entries",
                stages=[override.name],
                config_path=("stages", index, "name"),
            )
        seen.add(override.name)
        base = merged[override.name].model_dump()
        for field in override.model_fields_set - {"name"}:
            value = getattr(override, field)
            if field == "runtime" and value is not None:
                base["runtime"] = _merge_runtime(base["runtime"], value)
            elif field == "args" and value is not None:
                # Keys are added or replaced, so the arguments a declaration's
                # factory relies on survive an override that adds one option.
                base["args"] = {**base["args"], **value}
            else:
                base[field] = value.model_dump() if isinstance(value, BaseModel) else value
        merged[override.name] = _validated(StageConfig, base, f"{source}: stage {override.name!r}", ("stages", index))
    # model_copy(deep=True) copies the pipeline but not what `update` puts in: copy the stages too,
    # so the merged pipeline shares no mutable `args` with the model's declaration.
    stages = tuple(merged[n].model_copy(deep=True) for n in pipeline.stage_names)
    return pipeline.model_copy(update={"stages": stages}, deep=True)


def _merge_runtime(base: dict[str, Any], override: RuntimeConfig) -> dict[str, Any]:
    resources = dict(base.get("resources") or {})
    resources.update(override.resources.model_dump(include=override.resources.model_fields_set))
    return {**base, "resources": resources}


def _validated(model: type[BaseModel], data: Any, where: str, config_path: KeyPath) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        text, first, _ = _describe(error)
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{where}: {text}", config_path=(*config_path, *first)) from None


def _describe(
    error: ValidationError, locations: ConfigLocations | None = None
) -> tuple[str, KeyPath, tuple[Problem, ...]]:
    """One clause per problem, each led by its `file:line:column` where known but the first (the message
    leads with that one's), then the field path and what was wrong; the config path of the first problem;
    and the problems shown."""
    errors = error.errors()
    # A list whose only item failed is also "too short" (pydantic counts the items that validated):
    # that says nothing the item's own error does not, and wrongly says the list is empty.
    inner = [tuple(item["loc"]) for item in errors if item["type"] not in ("too_short", "too_long")]
    errors = [
        item
        for item in errors
        if item["type"] != "too_short"
        or not any(loc[: len(item["loc"])] == tuple(item["loc"]) and len(loc) > len(item["loc"]) for loc in inner)
    ]
    problems = []
    for item in errors[:3]:
        loc = tuple(item["loc"])
        where = clipped(dotted(loc), 200)
        location = locations.find(loc) if locations is not None else None
        message = clipped(item["msg"].removeprefix("Value error, "), 500)
        if item["type"] == "extra_forbidden":
            message = "unknown key (not part of the schema; check the spelling)"
        elif item["type"] == "missing":
            message = (
                f"position {loc[-1]} is missing (the list is too short)"
                if loc and isinstance(loc[-1], int)
                else "required field is missing"
            )
        elif item["type"] in ("too_short", "too_long"):
            message = _length_message(item)
        problems.append(Problem(where, message, location))
    parts = [
        str(replace(problem, location=None)) if index == 0 else str(problem) for index, problem in enumerate(problems)
    ]
    more = len(errors) - 3
    first: KeyPath = tuple(errors[0]["loc"]) if errors else ()
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else ""), first, tuple(problems)


def _length_message(item: Mapping[str, Any]) -> str:
    """pydantic's `Tuple should have at least 1 item after validation, not 0` in the operator's words."""
    context = item.get("ctx") or {}
    actual = context.get("actual_length")
    got = "none" if actual == 0 else f"{actual}"
    if item["type"] == "too_short":
        least = context.get("min_length")
        return f"needs at least {least} item{'' if least == 1 else 's'}, got {got}"
    most = context.get("max_length")
    return f"takes at most {most} item{'' if most == 1 else 's'}, got {got}"


def _codepoint(character: Any) -> str:
    return f"U+{character:04X}" if isinstance(character, int) else repr(character)


@dataclass(frozen=True)
class SourcedConfig:
    """A parsed config file and where each of its entries is written (to locate errors about them)."""

    config: ConfigFile
    locations: ConfigLocations


def parse_config_source(text: str, source: str = "<config>") -> SourcedConfig:
    """Parse YAML text (safe loader only) into a ConfigFile and its locations.

    Errors start with `source:line:column:` where the YAML parser or the node tree gives one, then name the
    field and what was wrong.
    """
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters at once
    except yaml.reader.ReaderError as error:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: malformed YAML: character {_codepoint(error.character)} at offset "
            f"{error.position} is not allowed in YAML; remove it",
        ) from None
    try:
        node = loader.get_single_node()
        locations = node_locations(node, source)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as error:
        problem = " ".join((error.problem or str(error)).split())
        mark = error.problem_mark
        if mark is None:
            raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: malformed YAML: {problem}") from None
        location = mark_location(source, mark)
        raise ConfigError(
            ErrorCode.INVALID_CONFIG, f"{location}: malformed YAML: {problem}", location=location
        ) from None
    except yaml.YAMLError as error:
        problem = " ".join(str(error).split())
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: malformed YAML: {problem}") from None
    except ValueError as error:
        # The constructor converts scalars itself: an integer past Python's
        # digit limit raises ValueError, not a YAMLError.
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: a value cannot be read: {error}") from None
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: the file is empty; expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{locations.find(()) or source}: expected a mapping with `model_path`/`stages` or `pipeline`, "
            f"got {type(data).__name__}",
            location=locations.find(()),
        )
    try:
        config = ConfigFile.model_validate(data)
    except ValidationError as error:
        text, first, problems = _describe(error, locations)
        written = locations.find(first)
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{written or source}: {text}",
            config_path=first,
            location=written,
            problems=problems,
        ) from None
    if config.pipeline is not None and (config.model_path is not None or config.stages):
        raise locations.locate(
            ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"{source}: give either `pipeline` (a pipeline declared in full) or `model_path` with "
                "`stages` overrides, not both",
                config_path=("pipeline",),
            )
        )
    return SourcedConfig(config, locations)


def parse_config_text(text: str, source: str = "<config>") -> ConfigFile:
    """Parse YAML text (safe loader only) into a ConfigFile; errors name the file, line, column and field."""
    return parse_config_source(text, source).config


def config_key_lines(path: str | Path) -> dict[KeyPath, int]:
    """Each key path of a config file (as `load_config` reads it) -> its 1-based line, for `plan --explain`."""
    text = Path(path).read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:
        return node_locations(loader.get_single_node(), str(path)).lines()
    finally:
        loader.dispose()


def load_config_source(path: str | Path) -> SourcedConfig:
    """Read and parse a YAML config file, keeping where each entry is written."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(ErrorCode.INVALID_CONFIG, f"cannot read config {str(path)!r}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{path}: not UTF-8 text (byte 0x{error.object[error.start]:02x} at offset {error.start}); "
            "save the config as UTF-8",
        ) from None
    return parse_config_source(text, str(path))


def load_config(path: str | Path) -> ConfigFile:
    """Read and parse a YAML config file."""
    return load_config_source(path).config
