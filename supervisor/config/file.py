"""The config file's schema (ConfigFile), and merging its stage overrides onto a model's pipeline.

Placement limits, stage overrides, per process group settings (replicas,
GPUs, node, autoscaling) and voice names. Pure: every override yields a new
pipeline; a declaration is never mutated.
"""

from __future__ import annotations

from typing import Annotated, Any, Mapping

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, field_validator, model_validator

from stagevisor.supervisor.config.pipeline import (
    MAX_GPU_ID,
    Frozen,
    PipelineConfig,
    RuntimeConfig,
    StageChecks,
    StageConfig,
    check_fraction,
    check_name,
    received,
    written,
)
from stagevisor.supervisor.config.validation import validated
from stagevisor.supervisor.errors import ConfigError, ErrorCode, shown


class PlacementConfig(Frozen):
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


class StageOverride(StageChecks):
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
        raise ValueError(f"{what} must be an integer from 1 to {MAX_REPLICAS}, got {received(value)}")
    if not 1 <= value <= MAX_REPLICAS:
        raise ValueError(f"{what} must be from 1 to {MAX_REPLICAS}, got {written(value)}")
    return value


def replicas_from_text(text: str, what: str = "replicas") -> int:
    """A replica count an operator typed (`--process-replicas P=N`, `stagevisor scale G=N`): an integer in
    [1, MAX_REPLICAS], `-1` out of range like `0`, anything not an integer named as typed."""
    text = text.strip()
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"{what} must be an integer from 1 to {MAX_REPLICAS}, got {text!r}")
    return check_replicas(int(text), what)


class AutoscaleConfig(Frozen):
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


# Keys and values of the config's name maps, each checked as its own entry, so an error points at the entry.
ProcessName = Annotated[str, BeforeValidator(lambda value: check_name(value, "process"))]
VoiceName = Annotated[str, BeforeValidator(lambda value: check_name(value, "voice name"))]
ModelVoice = Annotated[str, BeforeValidator(lambda value: check_name(value, "the model's voice it stands for"))]


class ProcessConfig(Frozen):
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
            raise ValueError(f"gpus must be a non-empty list of GPU ids (int >= 0), got {written(value)}")
        if max(value) > MAX_GPU_ID:
            raise ValueError(f"gpus lists {max(value)}, which is not a GPU id: ids run from 0 to {MAX_GPU_ID}")
        if len(set(value)) != len(value):
            raise ValueError(f"gpus lists a GPU twice: {shown(value)}")
        return tuple(value)


class ConfigFile(Frozen):
    """The YAML file: either `model_path` + `stages` overrides, or a `pipeline` declared in full."""

    model_path: str | None = Field(
        None,
        description="A built-in model: its key, one of its paths (a hub id), or a local directory with a config.json "
        "(a relative one is found from the working directory, as --model-path is, not from the config file's).",
    )
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Limits applied to every GPU.")
    stages: tuple[StageOverride, ...] = Field(
        (), description="Changes to the model's stages, merged by name; only the fields given change."
    )
    pipeline: PipelineConfig | None = Field(
        None, description="A pipeline declared in full, instead of `model_path` and `stages`."
    )
    processes: dict[ProcessName, ProcessConfig] = Field(
        default_factory=dict, description="Per process group settings (replicas), keyed by process name."
    )
    voices: dict[VoiceName, ModelVoice] = Field(
        default_factory=dict,
        description="Voice names clients may send -> the model's voice they stand for (its name in any case), "
        "e.g. {alloy: heart}; overrides the default map of OpenAI's voice names.",
    )

    @field_validator("voices", mode="before")
    @classmethod
    def _voices(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"voices must be a mapping of voice name -> the model's voice, got {written(value)}")
        return value

    @field_validator("processes", mode="before")
    @classmethod
    def _processes(cls, value: Any) -> Any:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"processes must be a mapping of process name to settings, got {written(value)}")
        # `vocoder:` with nothing under it (null) is a process with every setting left out, as `vocoder: {}`.
        return {name: {} if settings is None else settings for name, settings in value.items()}


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
            if value is None and field in ("args", "runtime"):
                continue  # a null section is one left out (Frozen): nothing of it changes
            if field == "runtime":
                base["runtime"] = _merge_runtime(base["runtime"], value)
            elif field == "args":
                # Keys are added or replaced, so the arguments a declaration's
                # factory relies on survive an override that adds one option.
                base["args"] = {**base["args"], **value}
            else:
                base[field] = value.model_dump() if isinstance(value, BaseModel) else value
        merged[override.name] = validated(StageConfig, base, f"{source}: stage {override.name!r}", ("stages", index))
    # model_copy(deep=True) copies the pipeline but not what `update` puts in: copy the stages too,
    # so the merged pipeline shares no mutable `args` with the model's declaration.
    stages = tuple(merged[n].model_copy(deep=True) for n in pipeline.stage_names)
    return pipeline.model_copy(update={"stages": stages}, deep=True)


def _merge_runtime(base: dict[str, Any], override: RuntimeConfig) -> dict[str, Any]:
    resources = dict(base.get("resources") or {})
    resources.update(override.resources.model_dump(include=override.resources.model_fields_set))
    return {**base, "resources": resources}
