"""Process groups: which stages share a process, which links cross between processes, and replicas of a group.

Pure functions over PipelineConfig and ProcessGroup; each refusal is a typed error naming what the operator can change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from stagevisor.supervisor.config import EdgeName, PipelineConfig, StageConfig
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, PlacementError
from stagevisor.supervisor.placement.wording import names_text
from stagevisor.supervisor.plan import ProcessGroup


def tp_group_name(stage: StageConfig, rank: int) -> str:
    return f"{stage.process or stage.name}_tp{rank}"


def group_key(stage: StageConfig) -> str:
    """Stages with equal keys share a process; a TP stage never shares."""
    return f"\0tp:{stage.name}" if stage.tp_size > 1 else stage.process or stage.name


def crossing_links(pipeline: PipelineConfig) -> tuple[EdgeName, ...]:
    """The links whose two stages run in different processes, in stage order."""
    keys = {s.name: group_key(s) for s in pipeline.stages}
    return tuple(link for link in pipeline.links() if keys[link[0]] != keys[link[1]])


@dataclass(frozen=True)
class ReplicaRequest:
    """Replicas asked for one process group, by `processes:` in YAML or `--process-replicas`."""

    process: str
    replicas: int
    gpus: tuple[int, ...] | None
    """GPUs to spread over (YAML `gpus`); None keeps every replica on the group's GPU."""
    origin: str
    """Where it was asked, for messages: `--process-replicas 'vocoder=2'` or `config.yaml: processes.vocoder`."""
    config_path: KeyPath = ()
    """The config entry that asked (`("processes", "vocoder")`); empty for a command-line option alone."""
    running: bool = False
    """Asked of a running daemon (`stagevisor scale`): its group names are the ones it runs, not a plan's to be."""
    declared: int = 1
    """The count the config declares for the process (1 where it declares none): a `--process-replicas` that
    asks another count changes the plan."""


def replicate(groups: tuple[ProcessGroup, ...], requests: Sequence[ReplicaRequest]) -> tuple[ProcessGroup, ...]:
    """The groups with their replica counts and GPUs. Replication never moves a stage, so no edge newly splits.

    MISSING_PROCESS for a name that is not a process group; TP_STAGE for a
    tensor-parallel stage (its ranks are one model, not copies);
    INVALID_CONFIG for GPUs given to a CPU group or not including the GPU its
    stages declare.
    """
    by_name = {g.name: g for g in groups if g.tp_size == 1}
    tp_stage = {}  # a rank's process name, and the name the ranks share, -> the TP stage
    for g in groups:
        if g.tp_size > 1:
            tp_stage[g.name] = tp_stage[g.name.rsplit("_tp", 1)[0]] = g.stages[0]
    replaced: dict[str, ProcessGroup] = {}
    for request in requests:
        # A plain group may carry the name a TP stage's ranks share (`engine` beside `engine_tp0`): it is that group.
        if request.process in tp_stage and request.process not in by_name:
            if request.replicas == 1 and request.gpus is None:
                continue  # a `processes:` entry that only sets what is not replication (its `node:`)
            raise PlacementError(
                ErrorCode.TP_STAGE,
                f"{request.origin}: process {request.process!r} runs tensor-parallel stage "
                f"{tp_stage[request.process]!r}, whose ranks together hold one copy of the model; "
                "it cannot be replicated",
                stages=[tp_stage[request.process]],
                config_path=request.config_path,
            )
        group = by_name.get(request.process)
        if group is None:
            raise PlacementError(
                ErrorCode.MISSING_PROCESS,
                f"{request.origin}: there is no process group named {request.process!r}; process groups: "
                f"{names_text(by_name)}"
                + ("" if request.running else " (names apply after --isolate-stage and --stage-process)"),
                config_path=request.config_path,
            )
        spread: tuple[int | None, ...] = ()
        if request.gpus is not None:
            if group.gpu is None:
                raise ConfigError(
                    ErrorCode.INVALID_CONFIG,
                    f"{request.origin}: process {group.name!r} runs on CPU, so its replicas have no GPUs to "
                    "spread over; drop `gpus`",
                    stages=list(group.stages),
                    config_path=(*request.config_path, "gpus") if request.config_path else (),
                )
            if group.gpu not in request.gpus:
                raise ConfigError(
                    ErrorCode.INVALID_CONFIG,
                    f"{request.origin}: `gpus` {list(request.gpus)} must include GPU {group.gpu}, where the "
                    f"stages of process {group.name!r} are placed (replica 0 runs there)",
                    stages=list(group.stages),
                    gpu=group.gpu,
                    config_path=(*request.config_path, "gpus") if request.config_path else (),
                )
            start = request.gpus.index(group.gpu)
            spread = tuple(request.gpus[(start + i) % len(request.gpus)] for i in range(request.replicas))
        if request.replicas == 1:
            spread = ()
        replaced[group.name] = replace(
            group, replicas=request.replicas, replica_gpus=spread, spread_gpus=request.gpus or ()
        )
    return tuple(replaced.get(g.name, g) for g in groups)


def layout_groups(pipeline: PipelineConfig) -> tuple[ProcessGroup, ...]:
    """Process groups in the order of their first stage; GROUP_SPANS_GPUS when one needs two GPUs."""
    members: dict[str, list[StageConfig]] = {}
    for stage in pipeline.stages:
        members.setdefault(group_key(stage), []).append(stage)
    groups: list[ProcessGroup] = []
    for stages in members.values():
        first = stages[0]
        if first.tp_size > 1:
            groups.extend(
                ProcessGroup(tp_group_name(first, r), (first.name,), first.gpus[r], None, r, first.tp_size)
                for r in range(first.tp_size)
            )
            continue
        gpus = {s.gpus[0] for s in stages if s.gpus}
        if len(gpus) > 1:
            on = sorted(gpus)
            # The entry to point at: the last stage of the process whose GPU is not the first GPU stage's.
            on_gpus = [s for s in stages if s.gpus]
            odd = [s for s in on_gpus if s.gpus[0] != on_gpus[0].gpus[0]][-1]
            raise PlacementError(
                ErrorCode.GROUP_SPANS_GPUS,
                f"process {first.process!r} would hold stages on GPUs {on} "
                f"({names_text(s.name for s in stages if s.gpus)}); a process binds one GPU, so place "
                "stages on different GPUs in different processes",
                stages=[s.name for s in stages if s.gpus],
                gpu=on[1],
                config_path=("stages", pipeline.stages.index(odd), "gpu"),
            )
        groups.append(
            ProcessGroup(first.process or first.name, tuple(s.name for s in stages), next(iter(gpus), None), None)
        )
    return tuple(groups)
