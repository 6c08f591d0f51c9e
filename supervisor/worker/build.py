"""Building a worker's stages: each factory imported and called with its args and the values it accepts, and what
it returns checked against the executor contract (a `process` coroutine), before the worker reports READY."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import sys
import time
from typing import Any, Callable, Iterable, Mapping, cast

from stagevisor.stages.base import (
    max_text_chars_declared_by,
    usable_max_text_chars,
    voices_declared_by,
)
from stagevisor.supervisor.errors import clipped
from stagevisor.supervisor.plan import PlannedStage
from stagevisor.supervisor.worker.app_paths import import_failure
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.worker")


class StageBuildError(Exception):
    """A stage's factory raised; carries the stage name so the daemon can name the root cause.

    A failed import says which one, coded as `stagevisor check` says it (MODULE_NOT_FOUND, MISSING_DEPENDENCY).
    """

    def __init__(self, stage: str, cause: BaseException, factory: str | None = None) -> None:
        problem = import_failure(stage, factory, cause, sys.path) if factory else None
        why = f"{problem.code.value}: factory {factory!r} cannot be imported: {problem.reason()}" if problem else None
        super().__init__(f"stage {stage!r} failed to build: {why or f'{type(cause).__name__}: {cause}'}")
        self.stage = stage
        self.cause = cause


def resolve_factory(path: str) -> Callable[..., Any]:
    """Import `module:callable` (the callable may be dotted, e.g. `pkg.mod:Class.build`)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"factory {path!r} is not of the form 'module:callable'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"factory {path!r} is not callable")
    return target


def factory_kwargs(factory: Callable[..., Any], args: Mapping[str, Any], injected: Mapping[str, Any]) -> dict[str, Any]:
    """The stage's `args` plus each injected value the factory's signature accepts.

    Injected values describe where the stage really runs, so they win over an
    `args` entry of the same name.
    """
    kwargs = dict(args)
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: inject nothing
        return kwargs
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    names = {
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    for name, value in injected.items():
        if accepts_any or name in names:
            kwargs[name] = value
    return kwargs


async def build_stage(stage: PlannedStage, spec: WorkerSpec) -> Any:
    """Call the stage's factory (sync or async) with its args and the values it accepts."""
    if stage.factory is None:
        raise ValueError(f"stage {stage.name!r} has no factory to build it from")
    factory = resolve_factory(stage.factory)
    # The CUDA ordinal to use in this process (0 under isolation); the physical
    # device is in the topology (`physical_gpu`).
    gpu_id = spec.local_gpu if stage.gpu is not None else None
    injected = {
        "model_path": spec.model_path,
        "gpu_id": gpu_id,
        "total_gpu_memory_fraction": stage.total_gpu_memory_fraction,
    }
    built = factory(**factory_kwargs(factory, stage.args, injected))
    if inspect.isawaitable(built):
        built = await built
    return built


class ExecutorContractError(TypeError):
    """What a factory returned is not an executor: `field` is `executor` (no process()) or `process`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_executor(stage: PlannedStage, built: Any) -> None:
    """Refuse what a factory returned unless it has an async `process(payload, ctx)`.

    Caught at build time, the stage fails to start with its name in the root
    cause, instead of a READY worker that fails every request. The one
    definition of this part of the contract: `stagevisor check` applies it too.
    `process` is looked up by name here because this is where foreign objects
    are validated against the Stage contract; past it, executors are typed as Stage.
    """
    process = getattr(built, "process", None)
    if built is None or process is None:
        what = "None" if built is None else f"a {type(built).__qualname__}"
        raise ExecutorContractError(
            "executor",
            f"factory {stage.factory!r} returned {what} with no process() "
            "method; it must return an executor with `async def process(self, payload, "
            "ctx)` (see stages/README.md)",
        )
    limit = max_text_chars_declared_by(built)
    if limit is not None and not usable_max_text_chars(limit):
        # Ignored, it would leave the stage open to texts longer than its author meant to accept.
        raise ExecutorContractError(
            "max_text_chars",
            f"{type(built).__qualname__}.max_text_chars is {clipped(repr(limit), 40)}; declare it as a positive "
            "int, the longest text the stage accepts (e.g. `max_text_chars = 500`)",
        )
    if inspect.isasyncgenfunction(process):
        raise ExecutorContractError(
            "process",
            f"factory {stage.factory!r} returned a {type(built).__qualname__} whose process yields (an async "
            "generator); stream each chunk with `await ctx.stream(chunk)` instead of `yield`, and return a dict "
            "or None (see stages/README.md)",
        )
    if not inspect.iscoroutinefunction(process):
        kind = "not callable" if not callable(process) else "not a coroutine function (`async def`)"
        raise ExecutorContractError(
            "process",
            f"factory {stage.factory!r} returned a {type(built).__qualname__} "
            f"whose process is {kind}; declare it `async def process(self, payload, ctx)` "
            "(see stages/README.md)",
        )


async def build_stages(spec: WorkerSpec, stamps: dict[str, float] | None = None) -> dict[str, Any]:
    """Build the group's stages in config order; the first failure is raised as StageBuildError.

    An executor without an async `process()` is a build failure too (check_executor).
    With `stamps`, records for the READY handshake's phases the wall-clock
    instant the stages were built (`built`) and the seconds spent importing
    the factories' modules (`factory_import_seconds`).
    """
    built: dict[str, Any] = {}
    importing = 0.0
    for stage in spec.stages:
        log.info("building stage %r%s", stage.name, f" ({stage.factory})" if stage.factory else "")
        try:
            if stage.factory is not None:
                start = time.perf_counter()
                with contextlib.suppress(Exception):  # build_stage raises it again, in order
                    resolve_factory(stage.factory)
                importing += time.perf_counter() - start
            built[stage.name] = await build_stage(stage, spec)
            check_executor(stage, built[stage.name])
        except (Exception, SystemExit) as error:  # sys.exit() in a factory too: the root cause names the stage
            # (not a cancellation, nor Ctrl-C: the worker is being stopped, not failing to build)
            raise StageBuildError(stage.name, error, stage.factory) from error
    if stamps is not None:
        stamps["built"] = time.time()
        stamps["factory_import_seconds"] = importing
    return built


def declared_voices(stages: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The voices the stages declare in an optional `voices` attribute: dicts with at least `id`.

    A declaration that is not a list of such dicts is logged and ignored, so a
    stage's metadata can never keep its worker from becoming READY.
    """
    voices: list[dict[str, Any]] = []
    for name, stage in stages.items():
        declared = voices_declared_by(stage)
        if declared is None:
            continue
        try:
            kept = []  # all or nothing: the warning says the declaration is ignored
            # Iterated as it stands: one that is not iterable raises the TypeError handled below.
            for voice in cast("Iterable[object]", declared):
                if not isinstance(voice, dict) or not isinstance(voice.get("id"), str):
                    raise TypeError(f"{clipped(repr(voice), 80)} is not a dict with a string 'id'")
                kept.append({k: v for k, v in voice.items() if isinstance(v, (str, int, float, bool, list))})
            voices.extend(kept)
        except TypeError as error:
            log.warning("stage %r declares voices the daemon cannot use (%s); ignored", name, error)
    return voices
