"""What a pipeline is made of: the schema a model declares (and a config's `pipeline:` spells out in full).

Stages, edges and their recommended fractions, the speech request options;
and the checks of names and GPU memory fractions the whole schema uses.
Pure: frozen pydantic models with `extra="forbid"`, whose checks say what
was received and what was expected.
"""

from __future__ import annotations

import functools
import math
import re
import typing
from typing import Annotated, Any, Mapping

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from stagevisor.supervisor.errors import shown

# Stage and process names end up in group names, socket paths and log lines,
# so they are kept to a conservative identifier alphabet.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: `$` would also match before a final newline


MAX_GPU_ID = 2**31 - 1
"""The largest GPU id: the admin API carries GPU ids as int32 (proto/stagevisor/v1/admin.proto), so a larger one
would plan, then fail the daemon's topology report."""


def written(value: Any) -> str:
    """An entry's value after `must be ..., got`: `null` where it was null or left empty (the word the schema's own
    messages use, not Python's `None`), else its value (`3`, `'x'`)."""
    return "null" if value is None else shown(value)


def received(value: Any) -> str:
    """`written`, with the type of a value that is not null (`str '2'`, `int 5`), where the type is the mistake."""
    return "null" if value is None else f"{type(value).__name__} {shown(value)}"


def check_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {received(value)}")
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
        raise ValueError(f"{what} must be a number in (0, 1], got {received(value)}{_as_text_hint(value)}")
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


def _as_text_hint(value: Any) -> str:
    """Why a number reached us as text, where it did: YAML 1.1 (PyYAML) reads `1e-3`, with no `.`, as a string,
    and so does a quoted `"0.5"`; the advice spells the number as YAML reads one."""
    if not isinstance(value, str):
        return ""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number):
        return ""
    written = repr(number)
    if "e" in written and "." not in written:  # 1e-07: text again to YAML 1.1, which wants 1.0e-07
        written = written.replace("e", ".0e")
    return f" (YAML reads it as text: write it unquoted with a '.', e.g. {written})"


class Frozen(BaseModel):
    """The base of every config model: unknown keys are refused, and a parsed config never changes.

    An optional section written as null (`placement: null`, `runtime: null`, `process_safe_edges: null`: a mapping
    or list with a default) means the same as leaving it out, as YAML writes an empty section (`placement:`). A
    field where null has a meaning of its own (`gpu: null`, a CPU stage) keeps it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_sections_are_omitted(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        omitted = {name for name, value in data.items() if value is None and name in _null_sections(cls)}
        return {name: value for name, value in data.items() if name not in omitted} if omitted else data


@functools.cache
def _null_sections(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` that are sections with a default: a mapping, a list or a nested model that null does
    not stand for (its type does not admit None)."""
    sections = set()
    for name, info in model.model_fields.items():
        if info.is_required():
            continue
        annotation = info.annotation
        kind = typing.get_origin(annotation) or annotation
        if kind in (tuple, dict) or (isinstance(kind, type) and issubclass(kind, BaseModel)):
            sections.add(name)
    return frozenset(sections)


class ResourcesConfig(Frozen):
    """GPU resources a stage declares for placement accounting."""

    total_gpu_memory_fraction: float | None = Field(
        None, description="Share of its GPU's memory this stage may use, in (0, 1]; None = undeclared."
    )

    @field_validator("total_gpu_memory_fraction", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> float | None:
        return check_fraction(value)


class RuntimeConfig(Frozen):
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
        raise ValueError(f"{what} must be a stage name or a list of stage names, got {written(value)}")
    names = tuple(check_name(v, f"{what} entry") for v in value)
    for index, name in enumerate(names):
        if name in names[:index]:
            # A repeated target would deliver every payload to it twice.
            raise ValueError(f"{what} lists stage {shown(name)} twice; name each target once")
    return names


class StageChecks(Frozen):
    """Field checks shared by a full stage entry and a partial override, so both read the same."""

    @field_validator("name", mode="before", check_fields=False)
    @classmethod
    def _name(cls, value: Any) -> str:
        return check_name(value, "stage name")

    @field_validator("process", mode="before", check_fields=False)
    @classmethod
    def _process(cls, value: Any) -> str | None:
        return None if value is None else check_name(value, "process")

    @field_validator("factory", mode="before", check_fields=False)
    @classmethod
    def _factory(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not re.match(r"^[\w.]+:[\w.]+$", value):
            raise ValueError(f"factory must be an import path 'module:callable', got {written(value)}")
        return value

    @field_validator("args", mode="before", check_fields=False)
    @classmethod
    def _args(cls, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ValueError(f"args must be a mapping of keyword arguments, got {written(value)}")
        return dict(value)

    @field_validator("gpu", mode="before", check_fields=False)
    @classmethod
    def _gpu(cls, value: Any) -> int | tuple[int, ...] | None:
        def one(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"gpu must be null, a GPU id (int >= 0) or a list of them, got {written(value)}")
            if v > MAX_GPU_ID:
                raise ValueError(f"gpu {v} is not a GPU id: ids run from 0 to {MAX_GPU_ID}")
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
            raise ValueError(f"tp_size must be an integer >= 1, got {written(value)}")
        return value

    @field_validator("next", "stream_to", mode="before", check_fields=False)
    @classmethod
    def _edges(cls, value: Any, info: Any) -> tuple[str, ...]:
        return _as_names(value, info.field_name)


class StageConfig(StageChecks):
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


def _recommended_fraction(value: Any) -> float:
    fraction = check_fraction(value, "recommended fraction")
    if fraction is None:  # undeclared is for a stage's own fraction; a recommendation is a value
        raise ValueError("recommended fraction must be a number in (0, 1], got null; leave out a stage with none")
    return fraction


# Keys and values of the pipeline's maps, each checked as its own entry, so an error points at the entry.
StageName = Annotated[str, BeforeValidator(lambda value: check_name(value, "stage"))]
RecommendedFraction = Annotated[float, BeforeValidator(_recommended_fraction)]
RoleName = Annotated[str, BeforeValidator(lambda value: check_name(value, "role alias"))]
AliasTarget = Annotated[str, BeforeValidator(lambda value: check_name(value, "role alias target (a stage)"))]


class EdgeResources(Frozen):
    """Fractions a model recommends when an edge is split across processes on a shared GPU."""

    edge: tuple[StrictStr, StrictStr] = Field(description="The edge [src, dst] these fractions are for.")
    fractions: dict[StageName, RecommendedFraction] = Field(
        description="Stage name -> recommended total_gpu_memory_fraction, each in (0, 1]."
    )

    @field_validator("fractions", mode="before")
    @classmethod
    def _fractions(cls, value: Any) -> Any:
        if not isinstance(value, Mapping) or not value:
            raise ValueError(f"fractions must be a non-empty mapping of stage -> fraction, got {written(value)}")
        return value


OPTION_TYPES = ("number", "integer", "boolean", "string")


class OptionSpec(Frozen):
    """One model-specific request option (e.g. noise_scale): its type, bounds and meaning."""

    type: str = Field("number", description="One of number, integer, boolean, string.")
    # int first: a bound written as an integer stays one (a float holds integers exactly only up to 2^53).
    minimum: int | float | None = Field(
        None, description="Smallest value accepted (numbers; a whole number for an integer option)."
    )
    maximum: int | float | None = Field(
        None, description="Largest value accepted (numbers; a whole number for an integer option)."
    )
    description: str = Field("", description="What the option changes, shown at GET /v1/models.")

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if value not in OPTION_TYPES:
            raise ValueError(f"option type {shown(value)} is not one of {', '.join(OPTION_TYPES)}")
        return value

    @field_validator("minimum", "maximum", mode="before")
    @classmethod
    def _number(cls, value: Any, info: ValidationInfo) -> Any:
        # One message for `int | float`, where pydantic gives one per member of the union.
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{info.field_name} must be a number or null, got {written(value)}")
        return value

    @field_validator("minimum", "maximum")
    @classmethod
    def _whole_for_integers(cls, value: int | float | None, info: ValidationInfo) -> int | float | None:
        """An integer option's bound as an int (GET /v1/models shows `100000`, not `100000.0`); refuses a fraction."""
        if info.data.get("type") != "integer" or not isinstance(value, float):
            return value
        if not value.is_integer():
            raise ValueError(f"an integer option's {info.field_name} must be a whole number, got {value:g}")
        return int(value)

    @model_validator(mode="after")
    def _bounds(self) -> "OptionSpec":
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum:g} is above maximum {self.maximum:g}")
        return self


DEFAULT_SEED_MAXIMUM = 2**32 - 1
"""The largest seed a model takes unless it declares its own (`seed_maximum`): the default voice's."""


class SpeechConfig(Frozen):
    """What a model takes in a speech request beyond text and voice; the HTTP API checks and lists it."""

    clones: StrictBool = Field(
        False, description="The model conditions on reference audio (ref_audio/ref_text, uploaded voices)."
    )
    instructions: StrictBool = Field(
        False, description="The model follows `instructions` (where false, its stages ignore or refuse them)."
    )
    seed: StrictBool = Field(False, description="The model takes a `seed` for its sampling.")
    speed: StrictBool = Field(
        True,
        description="The model takes a speaking rate: `speed` goes to the stages as the `speed` option where "
        "`options` declares one, else as `length_scale` (1/speed). Where false, the HTTP API takes only a `speed` "
        "of 1 (the default) and refuses any other naming `speed`, and GET /v1/models does not list it.",
    )
    seed_maximum: StrictInt = Field(
        DEFAULT_SEED_MAXIMUM,
        ge=0,
        description="The largest `seed` the model takes (the smallest is 0), where `seed` is true: the HTTP API "
        "refuses others naming this range, as the stages do over gRPC. A `seed` entry in `options` must be an "
        "integer whose bounds, where given, are 0 and this.",
    )
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
                check_name(name, "option")
        return value

    @model_validator(mode="after")
    def _one_seed_range(self) -> "SpeechConfig":
        """A `seed` option, where declared, has the model's seed range: the API checks and lists one range."""
        option = (self.options or {}).get("seed")
        if option is None:
            return self
        if not self.seed:
            raise ValueError("a seed option is declared but the model takes no seed: set seed: true, or drop it")
        within = option.minimum in (None, 0) and option.maximum in (None, self.seed_maximum)
        if option.type != "integer" or not within:
            given = [f"type {option.type}"]
            given += [
                f"{name} {bound}"
                for name, bound in (("minimum", option.minimum), ("maximum", option.maximum))
                if bound is not None
            ]
            raise ValueError(
                f"the seed option ({', '.join(given)}) must be an integer in the model's seed range "
                f"[0, {self.seed_maximum}]; set the largest seed once, as seed_maximum"
            )
        return self


class PipelineConfig(Frozen):
    """A pipeline: stages in order, plus what the model declares about splitting them."""

    name: str = Field(description="Pipeline name (the model key for built-in models).")
    stages: tuple[StageConfig, ...] = Field(min_length=1, description="The stages, in order; at least one.")
    process_safe_edges: tuple[tuple[StrictStr, StrictStr], ...] = Field(
        (), description="Edges [src, dst] whose handoff stays correct across a process boundary."
    )
    process_edge_resources: tuple[EdgeResources, ...] = Field(
        (), description="Recommended fractions applied when a placement option newly splits an edge."
    )
    role_aliases: dict[RoleName, AliasTarget] = Field(
        default_factory=dict, description="Stable role name -> this pipeline's stage name (e.g. vocoder)."
    )
    speech: SpeechConfig = Field(
        default_factory=SpeechConfig, description="What the model takes in a speech request (GET /v1/models)."
    )

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        return check_name(value, "pipeline name")

    @field_validator("role_aliases", mode="before")
    @classmethod
    def _aliases(cls, value: Any) -> Any:
        # A role is typed on the command line like a stage name, so both sides
        # use the stage-name alphabet; whether the target exists is a
        # structure check, made once all stages are known. Each entry is
        # checked as typed (RoleName, AliasTarget), so an error points at it.
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ValueError(f"role_aliases must be a mapping of role -> stage name, got {written(value)}")
        return value

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
