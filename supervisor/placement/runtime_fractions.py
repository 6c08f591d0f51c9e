"""Engine memory arguments in a stage's args against its placement fraction: warnings, or an error if strict. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from stagevisor.supervisor.config import PipelineConfig
from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.gpu_accounting import TOLERANCE
from stagevisor.supervisor.placement.wording import fraction_text
from stagevisor.supervisor.plan import ProcessGroup


ENGINE_MEMORY_ARGS = ("mem_fraction_static", "gpu_memory_utilization", "gpu_memory_fraction")
"""Engine settings that size GPU memory as a share of the device (SGLang, vLLM, and a common spelling)."""

INJECTED_FRACTION_ARG = "total_gpu_memory_fraction"
"""Given in `args`, this is replaced by the placement value for a factory that accepts it (worker/build.py)."""


@dataclass(frozen=True)
class RuntimeFractionMismatch:
    """A memory share a stage hands its engine in `args` that differs from its placement fraction."""

    stage: str
    argument: str
    """Where the value sits under the stage's args, dotted: `mem_fraction_static`, `engine.mem_fraction_static`."""
    value: float
    placement: float
    gpu: int
    group: str

    @property
    def runtime_uses(self) -> str:
        """`argument` when the engine sizes itself by its own setting, `placement` when the worker's value wins."""
        return "placement" if self.argument == INJECTED_FRACTION_ARG else "argument"

    def message(self) -> str:
        head = (
            f"stage {self.stage!r} passes args.{self.argument} {fraction_text(self.value)} but its "
            f"placement fraction on GPU {self.gpu} is {fraction_text(self.placement)}"
        )
        if self.runtime_uses == "placement":
            return (
                f"{head}: the runtime uses the placement value {fraction_text(self.placement)} (the worker "
                f"passes it as total_gpu_memory_fraction in place of the args entry); remove args.{self.argument}"
            )
        if not math.isfinite(self.value):
            return (
                f"{head}: {fraction_text(self.value)} is no share of GPU memory, so whatever the runtime makes of "
                f"it, it is not what placement accounts. Set args.{self.argument} to {fraction_text(self.placement)}"
            )
        if self.value > self.placement:
            effect = (
                f"with torch and CUDA the worker caps group {self.group!r} at its placement total, so an engine "
                "allocating through torch fails with out-of-memory and one with its own allocator overcommits "
                f"GPU {self.gpu}"
            )
        else:
            effect = f"{fraction_text(self.placement - self.value)} of GPU {self.gpu} stays reserved but unused"
        return (
            f"{head}: the runtime uses the argument {fraction_text(self.value)} (the engine sizes its memory by "
            f"its own setting) while placement accounts {fraction_text(self.placement)}; {effect}. Set "
            f"args.{self.argument} to {fraction_text(self.placement)}, or pass total_gpu_memory_fraction on to "
            "the engine in the factory"
        )


def _numeric(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _memory_args(args: Mapping[str, object], names: frozenset[str], prefix: str = "") -> Iterable[tuple[str, float]]:
    """(dotted path, value) of every numeric argument named in `names`, at any depth of nested mappings."""
    for key, value in args.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _memory_args(value, names, f"{path}.")
        elif key in names or (not prefix and key == INJECTED_FRACTION_ARG):
            number = _numeric(value)
            if number is not None:
                yield path, number


def runtime_fraction_mismatches(
    pipeline: PipelineConfig, groups: tuple[ProcessGroup, ...], extra_args: Mapping[str, Sequence[str]] | None = None
) -> tuple[RuntimeFractionMismatch, ...]:
    """Engine memory arguments in the GPU stages' args that disagree with their effective placement fraction.

    A stage with no placement fraction (alone on its GPU) has nothing to
    disagree with: its engine's own setting is the only declaration.
    `extra_args` maps a stage to more argument names its model declares.
    """
    group_of = {stage: group.name for group in groups for stage in group.stages}
    found = []
    for stage in pipeline.stages:
        if not stage.gpus or stage.fraction is None:
            continue
        names = frozenset(ENGINE_MEMORY_ARGS) | frozenset((extra_args or {}).get(stage.name, ()))
        for path, value in _memory_args(stage.args, names):
            # NaN compares unequal to nothing by `>`: a non-finite value is a mismatch of its own.
            if not math.isfinite(value) or abs(value - stage.fraction) > TOLERANCE:
                found.append(
                    RuntimeFractionMismatch(
                        stage.name, path, value, stage.fraction, stage.gpus[0], group_of.get(stage.name, stage.name)
                    )
                )
    return tuple(found)


def check_runtime_fractions(
    pipeline: PipelineConfig,
    groups: tuple[ProcessGroup, ...],
    strict: bool,
    extra_args: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """Warnings for runtime memory arguments that drift from placement; in strict mode the first is an error."""
    mismatches = runtime_fraction_mismatches(pipeline, groups, extra_args)
    if strict and mismatches:
        first = mismatches[0]
        also = f" (also: {'; '.join(m.message() for m in mismatches[1:])})" if mismatches[1:] else ""
        raise PlacementError(
            ErrorCode.RUNTIME_FRACTION_MISMATCH,
            f"{first.message()}{also}. placement.strict_runtime_fractions is true, so this is an error",
            stages=sorted({m.stage for m in mismatches}),
            gpu=first.gpu,
        )
    return [m.message() for m in mismatches]
