"""GPU accounting: the placement fractions on each GPU, declared where processes share it and within the limit. Pure."""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

from stagevisor.supervisor.config import EdgeName, PipelineConfig
from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.wording import edge_text, fraction_text, names_text
from stagevisor.supervisor.plan import ProcessGroup

# Fractions are decimal literals summed in binary floating point:
# 0.34 + 0.56 + 0.10 is 1.0000000000000002, which must fit a limit of 1.0.
TOLERANCE = 1e-9


GpuFractions = Mapping[str, "float | None"]
"""The declared fraction of every GPU stage (None: undeclared), in pipeline order."""


def gpu_fractions(pipeline: PipelineConfig) -> dict[str, float | None]:
    return {s.name: s.fraction for s in pipeline.stages if s.gpus}


def stages_on_gpu(
    fractions: GpuFractions, groups: tuple[ProcessGroup, ...], gpu: int
) -> tuple[tuple[str, float | None, int], ...]:
    """(stage, its fraction, how many of its workers run on the GPU) for each GPU stage there, in order."""
    counts: dict[str, int] = {}
    for group in groups:
        on_gpu = sum(1 for worker in group.workers() if worker.gpu == gpu)
        for name in group.stages:
            counts[name] = counts.get(name, 0) + on_gpu
    return tuple((name, fraction, counts[name]) for name, fraction in fractions.items() if counts.get(name))


def gpu_users(groups: tuple[ProcessGroup, ...]) -> dict[int, tuple[str, ...]]:
    """GPU id -> the workers that use it (group names, `group/i` for replicas), in group order."""
    users: dict[int, list[str]] = {}
    for group in groups:
        for worker in group.workers():
            if worker.gpu is not None:
                users.setdefault(worker.gpu, []).append(worker.name)
    return {gpu: tuple(names) for gpu, names in sorted(users.items())}


def check_fractions_declared(
    pipeline: PipelineConfig, groups: tuple[ProcessGroup, ...], crossing: tuple[EdgeName, ...], *, in_full: bool
) -> None:
    """Every GPU stage on a GPU shared by several processes needs a declared fraction. `in_full`: the pipeline is
    declared whole in a config (`pipeline:`), where the fractions go, rather than a model's."""
    owner = "the pipeline" if in_full else "the model"

    def advice(touching: set[str], missing: Sequence[str]) -> str:
        hints = []
        recommended: set[str] = set()
        for resources in pipeline.process_edge_resources:
            if resources.edge in crossing and touching & (set(resources.edge) | set(resources.fractions)):
                values = ", ".join(f"{s} {fraction_text(v)}" for s, v in resources.fractions.items())
                hints.append(f"{owner} recommends {values} for {edge_text(resources.edge)}")
                recommended.update(resources.fractions)
        if hints:
            unrecommended = [name for name in missing if name not in recommended]
            if unrecommended:  # the hints name other stages: say these have none
                hints.append(f"none for {names_text(unrecommended)}, so choose from a measurement")
            return "; ".join(hints)
        if any(set(edge) <= touching for edge in crossing):  # two processes on this GPU hand off across it
            return f"{owner} recommends no values for this split, so choose them from a measurement"
        # Nothing on this GPU is split: replicas of one process share it.
        return (
            "no split shares this GPU, replicas do: each replica counts its stages' fractions, so choose values "
            "that fit them all, from a measurement"
        )

    where = (
        "Declare them on those stages under `pipeline.stages` in the config"
        if in_full
        else "Declare them under `stages:` in a YAML config passed with --config"
    )
    check_fractions_present(gpu_fractions(pipeline), groups, advice, where)


def check_fractions_present(
    fractions: GpuFractions,
    groups: tuple[ProcessGroup, ...],
    advice: Callable[[set[str], Sequence[str]], str],
    where: str = "Declare them under `stages:` in a YAML config passed with --config",
) -> None:
    """MISSING_FRACTION for the first GPU shared by several workers with a stage that declares none."""
    for gpu, users in gpu_users(groups).items():
        if len(users) < 2:
            continue
        on_gpu = stages_on_gpu(fractions, groups, gpu)
        missing = [name for name, fraction, _ in on_gpu if fraction is None]
        if not missing:
            continue
        raise PlacementError(
            ErrorCode.MISSING_FRACTION,
            f"GPU {gpu} is shared by processes {names_text(users)}, so every stage on it needs "
            f"runtime.resources.total_gpu_memory_fraction; missing for {names_text(missing)}. "
            f"{where} ({advice({name for name, _, _ in on_gpu}, missing)}).",
            stages=missing,
            gpu=gpu,
        )


def gpu_totals(fractions: GpuFractions, groups: tuple[ProcessGroup, ...]) -> dict[int, float]:
    """GPU id -> the sum of the declared fractions of every stage (every TP rank, every replica) on it."""
    totals: dict[int, float] = {}
    for gpu in gpu_users(groups):
        totals[gpu] = sum((fraction or 0.0) * n for _, fraction, n in stages_on_gpu(fractions, groups, gpu))
    return totals


def declared_totals(fractions: GpuFractions, groups: tuple[ProcessGroup, ...]) -> dict[int, float | None]:
    """GPU id -> the total a Plan reports for it: gpu_totals, or None where no stage on it declares a fraction."""
    return {
        gpu: total if any(f is not None for _, f, _ in stages_on_gpu(fractions, groups, gpu)) else None
        for gpu, total in gpu_totals(fractions, groups).items()
    }


def check_limits(
    fractions: GpuFractions,
    groups: tuple[ProcessGroup, ...],
    limit: float,
    recommended: Collection[str] = (),
    where: str = "under `stages:` in a YAML config passed with --config",
) -> None:
    """Each GPU's total must fit the placement limit, within floating-point rounding. `recommended`: the stages
    whose fraction is the model's recommendation, which no config declares: the advice says where to declare one."""
    for gpu, total in gpu_totals(fractions, groups).items():
        if total > limit + TOLERANCE:
            on_gpu = [(name, f, n) for name, f, n in stages_on_gpu(fractions, groups, gpu) if f is not None]
            parts = ", ".join(
                f"{name} {fraction_text(f)}"
                + (" recommended" if name in recommended else "")
                + (f" x {n} replicas" if n > 1 else "")
                for name, f, n in on_gpu
            )
            undeclared = [name for name, _, _ in on_gpu if name in recommended]
            declare = (
                f" (for {names_text(undeclared)}, which take the recommended values, declare lower ones {where})"
                if undeclared
                else ""
            )
            raise PlacementError(
                ErrorCode.OVER_LIMIT,
                f"GPU {gpu} would carry total_gpu_memory_fraction {fraction_text(total)} ({parts}), over the "
                f"placement limit {fraction_text(limit)}; lower the stages' fractions{declare}"
                + (
                    " (the limit is 1 already, the most it may be)"
                    if limit >= 1.0
                    else " or raise placement.max_total_gpu_memory_fraction_per_gpu (at most 1)"
                ),
                stages=[name for name, _, _ in on_gpu],
                gpu=gpu,
            )
