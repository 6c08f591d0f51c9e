"""The structure rules a pipeline must satisfy (its graph, declarations, stage resources, process names).

Pure functions over PipelineConfig, checked before any placement rule; each
raises a typed error that names the stages or edge involved and says what the
operator can do.
"""

from __future__ import annotations

from typing import Any, Callable

from stagevisor.supervisor.config import EdgeName, PipelineConfig, StageConfig
from stagevisor.supervisor.errors import ConfigError, ErrorCode, PlacementError
from stagevisor.supervisor.placement.groups import tp_group_name
from stagevisor.supervisor.placement.wording import edge_text, names_text

Invalid = Callable[..., ConfigError]
"""Builds the INVALID_CONFIG error of one structure check: a message, and the stages or edge it names."""


def check_structure(pipeline: PipelineConfig, source: str) -> None:
    """Reject a pipeline whose graph or declarations are inconsistent, before any placement rule.

    Each error's config_path names the offending entry within the pipeline (`("stages", 2, "next", 0)`).
    """

    def invalid(message: str, **where: Any) -> ConfigError:
        return ConfigError(ErrorCode.INVALID_CONFIG, f"{source}: {message}", **where)

    names = pipeline.stage_names
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            raise invalid(
                f"stage {name!r} is declared twice; stage names must be unique",
                stages=[name],
                config_path=("stages", index, "name"),
            )
        seen.add(name)

    upstream: dict[str, str] = {}
    for index, stage in enumerate(pipeline.stages):
        for field, targets in (("next", stage.next), ("stream_to", stage.stream_to)):
            for position, dst in enumerate(targets):
                if dst not in seen:
                    raise invalid(
                        f"stage {stage.name!r}: {field} {dst!r} is not a stage; stages are {names_text(names)}",
                        stages=[stage.name, dst],
                        config_path=("stages", index, field, position),
                    )
                if dst == stage.name:
                    raise invalid(
                        f"stage {stage.name!r} sends to itself",
                        stages=[stage.name],
                        config_path=("stages", index, field, position),
                    )
        for position, dst in enumerate(stage.stream_to):
            if dst not in stage.next:
                raise invalid(
                    f"stage {stage.name!r} streams to {dst!r} but does not list it in `next`; "
                    "a stream_to edge is also a next link, add it to both",
                    stages=[stage.name, dst],
                    edge=(stage.name, dst),
                    config_path=("stages", index, "stream_to", position),
                )
        for position, dst in enumerate(stage.next):
            if dst in upstream and upstream[dst] != stage.name:
                raise invalid(
                    f"stage {dst!r} has two upstream stages ({upstream[dst]!r} and {stage.name!r}); "
                    "each stage may receive from one stage only",
                    stages=[upstream[dst], stage.name, dst],
                    config_path=("stages", index, "next", position),
                )
            upstream[dst] = stage.name
    _check_acyclic(pipeline, upstream, invalid)
    _check_connected(pipeline, invalid)

    links = set(pipeline.links())
    for index, edge in enumerate(pipeline.process_safe_edges):
        if edge not in links:
            raise invalid(
                f"process_safe_edges names {edge_text(edge)}, which is not a `next` link",
                edge=edge,
                config_path=("process_safe_edges", index),
            )
    described: dict[EdgeName, int] = {}
    for index, resources in enumerate(pipeline.process_edge_resources):
        if resources.edge in described:
            raise invalid(
                f"process_edge_resources describes {edge_text(resources.edge)} twice (entries "
                f"{described[resources.edge]} and {index}); give each edge one entry with all its fractions",
                edge=resources.edge,
                config_path=("process_edge_resources", index, "edge"),
            )
        described[resources.edge] = index
        if resources.edge not in links:
            raise invalid(
                f"process_edge_resources names {edge_text(resources.edge)}, which is not a `next` link",
                edge=resources.edge,
                config_path=("process_edge_resources", index, "edge"),
            )
        unknown = [s for s in resources.fractions if s not in seen]
        if unknown:
            raise invalid(
                f"process_edge_resources for {edge_text(resources.edge)} names unknown stages {names_text(unknown)}",
                stages=unknown,
                config_path=("process_edge_resources", index, "fractions", unknown[0]),
            )
    for alias, target in pipeline.role_aliases.items():
        if target not in seen:
            raise invalid(
                f"role alias {alias!r} points to unknown stage {target!r}",
                stages=[target],
                config_path=("role_aliases", alias),
            )

    for index, stage in enumerate(pipeline.stages):
        _check_stage_resources(stage, ("stages", index), invalid)
    check_process_names(pipeline)


def _check_acyclic(pipeline: PipelineConfig, upstream: dict[str, str], invalid: Invalid) -> None:
    # With at most one upstream each, a cycle is a walk up the chain that returns to its start.
    index = {name: i for i, name in enumerate(pipeline.stage_names)}
    for name in pipeline.stage_names:
        walk, current = [name], upstream.get(name)
        while current is not None:
            if current == name:
                # Point at the link that goes back up the file (to a stage declared no later than its
                # source): every cycle has one, and it is where a reader sees the loop close.
                src, dst = next((upstream[s], s) for s in walk if index[s] <= index[upstream[s]])
                raise invalid(
                    f"stages {names_text(walk)} form a cycle",
                    stages=walk,
                    config_path=("stages", index[src], "next", pipeline.stage(src).next.index(dst)),
                )
            walk.append(current)
            current = upstream.get(current)
            if len(walk) > len(upstream) + 1:
                break


def _check_connected(pipeline: PipelineConfig, invalid: Invalid) -> None:
    # A request enters at the first stage; a stage it can never reach would
    # start a worker that never receives work.
    first = pipeline.stages[0]
    nexts = {s.name: s.next for s in pipeline.stages}
    reached, todo = {first.name}, [first.name]
    while todo:
        for dst in nexts[todo.pop()]:
            if dst not in reached:
                reached.add(dst)
                todo.append(dst)
    unreachable = [n for n in pipeline.stage_names if n not in reached]
    if unreachable:
        raise invalid(
            f"{'stages' if len(unreachable) > 1 else 'stage'} {names_text(unreachable)} "
            f"{'are' if len(unreachable) > 1 else 'is'} not reachable from the first stage {first.name!r} "
            "through `next`; connect them or remove them (the first stage is where requests enter)",
            stages=unreachable,
            config_path=("stages", pipeline.stage_names.index(unreachable[0])),
        )


def _check_stage_resources(stage: StageConfig, entry: tuple[str, int], invalid: Invalid) -> None:
    gpus = stage.gpus
    if stage.tp_size > 1:
        if len(gpus) != stage.tp_size:
            raise invalid(
                f"stage {stage.name!r} has tp_size {stage.tp_size} but lists {len(gpus)} GPU(s); "
                "give one GPU id per rank, e.g. gpu: [0, 1]",
                stages=[stage.name],
                config_path=(*entry, "gpu"),
            )
        if len(set(gpus)) != len(gpus):
            raise invalid(
                f"stage {stage.name!r} places two TP ranks on one GPU: {list(gpus)}",
                stages=[stage.name],
                config_path=(*entry, "gpu"),
            )
    elif len(gpus) > 1:
        raise invalid(
            f"stage {stage.name!r} lists GPUs {list(gpus)} but tp_size is 1; set tp_size: {len(gpus)} "
            "or give a single GPU id",
            stages=[stage.name],
            config_path=(*entry, "gpu"),
        )
    if stage.tp_size == 1 and stage.process is None:
        raise ConfigError(
            ErrorCode.MISSING_PROCESS,
            f"stage {stage.name!r} has no `process`; every stage with tp_size 1 must name the process "
            "group it runs in (e.g. process: pipeline)",
            stages=[stage.name],
            config_path=(*entry, "process"),
        )


def check_process_names(pipeline: PipelineConfig) -> None:
    """A process name may not collide with a name generated for a TP rank."""
    generated: dict[str, str] = {}
    for index, stage in enumerate(pipeline.stages):
        if stage.tp_size > 1:
            for rank in range(stage.tp_size):
                name = tp_group_name(stage, rank)
                if name in generated:
                    raise PlacementError(
                        ErrorCode.NAME_COLLISION,
                        f"TP stages {generated[name]!r} and {stage.name!r} would both run a process named "
                        f"{name!r}; give them different `process` names",
                        stages=[generated[name], stage.name],
                        config_path=("stages", index, "process"),
                    )
                generated[name] = stage.name
    for index, stage in enumerate(pipeline.stages):
        if stage.tp_size == 1 and stage.process in generated:
            raise PlacementError(
                ErrorCode.NAME_COLLISION,
                f"process {stage.process!r} of stage {stage.name!r} collides with the process of rank "
                f"{stage.process.rsplit('_tp', 1)[1]} of TP stage {generated[stage.process]!r}; choose another name",
                stages=[stage.name, generated[stage.process]],
                config_path=("stages", index, "process"),
            )
