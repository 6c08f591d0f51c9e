"""The rules a process topology must satisfy: pipeline structure, process groups, and GPU accounting.

Pure functions over PipelineConfig; each rule raises a typed error that names
the stages, edge or GPU involved and says what the operator can do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from stagevisor.supervisor.config import EdgeName, PipelineConfig, StageConfig
from stagevisor.supervisor.errors import ConfigError, ErrorCode, KeyPath, PlacementError
from stagevisor.supervisor.plan import ProcessGroup

Invalid = Callable[..., ConfigError]
"""Builds the INVALID_CONFIG error of one structure check: a message, and the stages or edge it names."""

# Fractions are decimal literals summed in binary floating point:
# 0.34 + 0.56 + 0.10 is 1.0000000000000002, which must fit a limit of 1.0.
TOLERANCE = 1e-9


def edge_text(edge: EdgeName) -> str:
    return f"{edge[0]!r} -> {edge[1]!r}"


def names_text(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def fraction_text(value: float) -> str:
    return f"{round(value, 6):g}"


def tp_group_name(stage: StageConfig, rank: int) -> str:
    return f"{stage.process or stage.name}_tp{rank}"


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
        if request.process in tp_stage:
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
            raise PlacementError(
                ErrorCode.GROUP_SPANS_GPUS,
                f"process {first.process!r} would hold stages on GPUs {on} "
                f"({names_text(s.name for s in stages if s.gpus)}); a process binds one GPU, so place "
                "stages on different GPUs in different processes",
                stages=[s.name for s in stages if s.gpus],
                gpu=on[1],
            )
        groups.append(
            ProcessGroup(first.process or first.name, tuple(s.name for s in stages), next(iter(gpus), None), None)
        )
    return tuple(groups)


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

    def advice(touching: set[str]) -> str:
        hints = []
        for resources in pipeline.process_edge_resources:
            if resources.edge in crossing and touching & (set(resources.edge) | set(resources.fractions)):
                values = ", ".join(f"{s} {fraction_text(v)}" for s, v in resources.fractions.items())
                hints.append(f"{owner} recommends {values} for {edge_text(resources.edge)}")
        return (
            "; ".join(hints)
            if hints
            else f"{owner} recommends no values for this split, so choose them from a measurement"
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
    advice: Callable[[set[str]], str],
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
            f"{where} ({advice({name for name, _, _ in on_gpu})}).",
            stages=missing,
            gpu=gpu,
        )


def gpu_totals(fractions: GpuFractions, groups: tuple[ProcessGroup, ...]) -> dict[int, float]:
    """GPU id -> the sum of the declared fractions of every stage (every TP rank, every replica) on it."""
    totals: dict[int, float] = {}
    for gpu in gpu_users(groups):
        totals[gpu] = sum((fraction or 0.0) * n for _, fraction, n in stages_on_gpu(fractions, groups, gpu))
    return totals


def check_limits(fractions: GpuFractions, groups: tuple[ProcessGroup, ...], limit: float) -> None:
    """Each GPU's total must fit the placement limit, within floating-point rounding."""
    for gpu, total in gpu_totals(fractions, groups).items():
        if total > limit + TOLERANCE:
            on_gpu = [(name, f, n) for name, f, n in stages_on_gpu(fractions, groups, gpu) if f is not None]
            parts = ", ".join(
                f"{name} {fraction_text(f)}" + (f" x {n} replicas" if n > 1 else "") for name, f, n in on_gpu
            )
            raise PlacementError(
                ErrorCode.OVER_LIMIT,
                f"GPU {gpu} would carry total_gpu_memory_fraction {fraction_text(total)} ({parts}), over the "
                f"placement limit {fraction_text(limit)}; lower the stages' fractions"
                + (
                    " (the limit is 1 already, the most it may be)"
                    if limit >= 1.0
                    else " or raise placement.max_total_gpu_memory_fraction_per_gpu (at most 1)"
                ),
                stages=[name for name, _, _ in on_gpu],
                gpu=gpu,
            )


ENGINE_MEMORY_ARGS = ("mem_fraction_static", "gpu_memory_utilization", "gpu_memory_fraction")
"""Engine settings that size GPU memory as a share of the device (SGLang, vLLM, and a common spelling)."""

INJECTED_FRACTION_ARG = "total_gpu_memory_fraction"
"""Given in `args`, this is replaced by the placement value for a factory that accepts it (worker/main.py)."""


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
            if abs(value - stage.fraction) > TOLERANCE:
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
