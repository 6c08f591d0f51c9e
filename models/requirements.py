"""Before any worker starts: stand-ins run only when asked (`--stand-ins`); what the plan's model declares."""

from __future__ import annotations

from dataclasses import dataclass

from stagevisor.models.declaration import ModelDeclaration
from stagevisor.supervisor.plan import STANDIN_FACTORY
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.plan import Plan

STANDINS_FLAG = "--stand-ins"


def standin_stages(plan: Plan) -> tuple[str, ...]:
    """The plan's stages that stand-in executors would run, in stage order."""
    return tuple(stage.name for stage in plan.stages if stage.stand_in)


def check_runnable(plan: Plan, *, stand_ins: bool, command: str = "serve", again: str = "") -> None:
    """Raise StagevisorError unless the plan may start: a pure check, before any worker exists.

    STAND_IN_NOT_REQUESTED when a stage would run a stand-in executor (the
    model's stage names and handoffs, the default voice's weights) and
    `--stand-ins` was not given; the error shows `again`, the operator's own
    command with the flag added, else a `stagevisor COMMAND --model-path M` one.
    A real model's own requirements (its declaration's `requirements` hook)
    `serve` checks beside the extras.
    """
    standins = standin_stages(plan)
    if standins and not stand_ins:
        model = plan.model or "this pipeline"
        raise StagevisorError(
            ErrorCode.STAND_IN_NOT_REQUESTED,
            f"model {model!r} has no real executors here: its stage{'s' if len(standins) > 1 else ''} "
            f"{', '.join(map(repr, standins))} would run stand-ins, which keep the model's stages and handoffs but "
            f"speak with the default hibari voice, not the model's weights; to run them anyway, add {STANDINS_FLAG} "
            f"({again or f'stagevisor {command} --model-path {plan.model_path or model} {STANDINS_FLAG}'})",
            stages=standins,
        )


def declaration_of(plan: Plan) -> ModelDeclaration | None:
    """The declaration of the plan's model, by its key; None for a pipeline declared in full (no declaration)."""
    if plan.model is None:
        return None
    from stagevisor.models.registry import resolve_model

    try:
        # By the Plan's model key: its path may be a checkpoint directory or a hub id this host lacks.
        return resolve_model(plan.model)
    except StagevisorError:
        return None


def repeatable_options(plan: Plan) -> dict[str, str]:
    """The request options that make the plan's audio repeatable, so runs and topologies compare byte for byte.

    What its model declares (`ModelDeclaration.repeatable_options`: the Piper voice's noise scales at 0, a seed for
    Qwen3-TTS); for a pipeline declared in full, what the built-in models whose executors it runs declare.
    Executors from elsewhere get no option they may not know.
    """
    declaration = declaration_of(plan)
    if declaration is not None:
        return dict(declaration.repeatable_options)
    from stagevisor.models.registry import builtin_models

    factories = {stage.factory for stage in plan.stages} - {STANDIN_FACTORY, None}
    options: dict[str, str] = {}
    for model in builtin_models():
        if factories & {stage.factory for stage in model.pipeline.stages}:
            options.update(model.repeatable_options)
    return options


@dataclass(frozen=True)
class Unmet:
    """Something the plan needs here that is missing, found before any worker starts: `code` is MISSING_DEPENDENCY
    (an extra its executors need is not installed) or MISSING_REQUIREMENT (what the model's declaration needs, e.g.
    its checkpoint); `stages` are the stages it stops (all of them for a model's requirement)."""

    code: ErrorCode
    message: str
    stages: tuple[str, ...]


def unmet_requirements(plan: Plan) -> list[Unmet]:
    """What `serve`, `check` and `bench` check before any worker starts (a pure check: nothing is imported or
    loaded): the extras the plan's executors need, then its model's own `requirements` (a checkpoint), each with a
    message that says what to install or pass."""
    from stagevisor.stages.extras import missing_extras

    unmet = [
        Unmet(ErrorCode.MISSING_DEPENDENCY, need.message(), need.stages)
        for need in missing_extras((stage.name, stage.factory or "") for stage in plan.stages)
    ]
    declaration = declaration_of(plan) if plan.model_path is not None else None
    if declaration is not None and declaration.requirements is not None:
        stages = tuple(stage.name for stage in plan.stages)
        unmet += [
            Unmet(ErrorCode.MISSING_REQUIREMENT, f"model {declaration.key!r} cannot run here: {line}", stages)
            for line in declaration.requirements(plan.model_path)
        ]
    return unmet
