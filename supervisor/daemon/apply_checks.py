"""The refusals a live change (`stagevisor apply`) answers before it starts anything: a factory the daemon's workers
could not import, a model path other than the served one, a launcher or daemon state that cannot switch, a GPU that
cannot hold both topologies at once. Each takes what it judges as data and raises (or returns) a typed error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from stagevisor.supervisor.daemon.lifecycle import DaemonState, GroupState
from stagevisor.supervisor.daemon.replicas import cpu_host_advice
from stagevisor.supervisor.errors import ConfigError, DaemonError, ErrorCode, PlacementError
from stagevisor.supervisor.placement.diff import check_switch_budget
from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.daemon.runner import WorkerRunner
    from stagevisor.supervisor.placement.request import PlacementRequest


def unimportable(plan: Plan, paths: tuple[str, ...]) -> ConfigError | None:
    """MODULE_NOT_FOUND (or MISSING_DEPENDENCY) for a factory of `plan` its new workers could not import: they
    import with the daemon's path (`paths`: serve's --app-dir, its config's directory, its working directory). An
    apply's own --config directory is not added: a client of the admin API does not choose what the daemon
    imports."""
    from stagevisor.supervisor.worker.app_paths import unimportable_factories

    unfound = unimportable_factories(((stage.name, stage.factory) for stage in plan.stages), paths)
    if not unfound:
        return None
    remedy = (
        "apply's workers import with the daemon's path (searched first: "
        f"{', '.join(paths) or 'its working directory'}), set when it started: put the module in one of those "
        "directories, or restart the daemon with --app-dir DIR (apply does not add its --config's directory)"
    )
    first = unfound[0]
    return ConfigError(first.code, "; ".join(item.message(remedy) for item in unfound))


def other_model(plan: Plan, served_plan: Plan) -> PlacementError | None:
    """INVALID_CONFIG for a plan of a model other than the one the daemon serves (`served_plan`'s): an apply
    changes the topology, never the model."""
    if plan.model == served_plan.model:
        return None
    return PlacementError(
        ErrorCode.INVALID_CONFIG,
        f"the daemon serves {served_plan.model!r}; apply changes its topology, not its model "
        f"(the new plan is for {plan.model!r}): give apply the daemon's model "
        f"(--model-path {served_plan.model_path or served_plan.model}, or a --config for it), "
        "or start a daemon for the other model",
    )


def check_model_path(request: PlacementRequest, served_plan: Plan) -> None:
    """INVALID_CONFIG for a request (its --model-path, or its config's `model_path`) naming a model path other than
    the one the daemon serves (`served_plan`'s), before planning it: an apply changes the topology, never the weights
    the workers load, and the daemon neither reads a directory a client of the admin API names nor lets its workers
    load from one. Another model's registry key or hub id goes on to be refused as another model (`apply`), and the
    served model's key is accepted where the daemon was started without a model path."""
    from stagevisor.models.registry import declared_model
    from stagevisor.supervisor.placement.request import named_model_paths

    served, model = served_plan.model_path, served_plan.model
    for where, named in named_model_paths(request):
        if _same_model_path(named, served):
            continue
        declared = declared_model(named)
        if declared is not None and (declared.key != model or served is None):
            continue  # another model (refused as such once planned), or the served one named by its key
        given = f"--model-path {served}" if served is not None else "no --model-path"
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"{where} {named!r} is not the model path the daemon serves ({served!r}): apply changes the topology, "
            f"never the model's weights, and loads nothing from a path a client names; give apply {given} "
            "(and the same `model_path` in a --config), or restart the daemon with the other model path",
        )


def _same_model_path(named: str, served: str | None) -> bool:
    """Whether a model path names the served one as --model-path is matched (surrounding spaces and a trailing slash
    dropped)."""
    return served is not None and named.strip().rstrip("/") == served.strip().rstrip("/")


def check_switchable(
    running: Plan, plan: Plan, *, launcher: str, state: DaemonState, runners: Mapping[str, WorkerRunner]
) -> None:
    """Refuse a switch from `running` to `plan` the daemon cannot make now: another launcher, a daemon not SERVING,
    a GPU that cannot hold both topologies at once (PlacementError or DaemonError)."""
    if launcher != "local":
        raise DaemonError("apply needs the local launcher; with --launcher ray, restart with the new plan")
    if state is not DaemonState.SERVING:
        raise DaemonError(f"cannot apply a new topology while the daemon is {state.value}{_advice(state, runners)}")
    try:
        check_switch_budget(running, plan)
    except PlacementError as refusal:
        raise refusal.adding(_cpu_advice(refusal, runners)) from None


def _cpu_advice(refusal: PlacementError, runners: Mapping[str, WorkerRunner]) -> str:
    """For a switch refused MISSING_FRACTION on a GPU whose running workers all run on CPU here (no CUDA device):
    how to plan its stages as CPU groups, as a restart's refusal says. "" otherwise."""
    if refusal.code is not ErrorCode.MISSING_FRACTION or refusal.gpu is None or not refusal.stages:
        return ""
    on_gpu = [r for r in runners.values() if r.spec.group.gpu == refusal.gpu]
    if not on_gpu or any(runner.device != "cpu" for runner in on_gpu):
        return ""
    return cpu_host_advice(
        f"the workers on GPU {refusal.gpu}", "the stages", refusal.stages, "them as CPU groups, which an apply switches"
    )


def _advice(state: DaemonState, runners: Mapping[str, WorkerRunner]) -> str:
    """What a DEGRADED daemon's operator can do before a topology change: which groups are down, and how."""
    if state is not DaemonState.DEGRADED:
        return ""
    down = [r for r in runners.values() if r.state is not GroupState.READY or r.silence]
    named = ", ".join(f"{r.name!r} is {'silent' if r.state is GroupState.READY else r.state.value}" for r in down)
    first = down[0].name if down else "GROUP"
    return (
        f" ({named}): wait until `stagevisor status` says SERVING (`stagevisor restart {first}` starts a FAILED "
        "group again), or restart the daemon with the new plan"
    )
