"""Placement: model + YAML + CLI placement options -> a validated Plan, or a typed error.

Pure. The flow is: resolve the model, merge the YAML onto a copy, check the
structure, apply `--stage-process` / `--isolate-stage` to another copy, then
judge the result: unsafe edges, groups spanning GPUs, conflicting
recommendations (for stages that would receive one), missing fractions, GPU
limits, in that order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

from stagevisor.supervisor.config import (
    ConfigFile,
    check_replicas,
    EdgeName,
    PipelineConfig,
    PlacementConfig,
    StageConfig,
)
from stagevisor.supervisor.errors import ConfigError, ErrorCode, PlacementError, StagevisorError
from stagevisor.supervisor.plan import (
    Autoscale,
    Edge,
    EdgeKind,
    FractionSource,
    GpuBudget,
    Plan,
    PlannedStage,
    ProcessGroup,
)

if TYPE_CHECKING:
    from stagevisor.models.declaration import ModelDeclaration
from stagevisor.supervisor.placement.gpu_accounting import (
    TOLERANCE,
    check_fractions_declared,
    check_fractions_present,
    check_limits,
    gpu_fractions,
    declared_totals,
    gpu_users,
)
from stagevisor.supervisor.placement.groups import ReplicaRequest, crossing_links, group_key, layout_groups, replicate
from stagevisor.supervisor.placement.options import Assignment, apply_assignments, parse_assignments, resolve_stage
from stagevisor.supervisor.placement.runtime_fractions import check_runtime_fractions
from stagevisor.supervisor.placement.structure import check_process_names, check_structure
from stagevisor.supervisor.placement.wording import edge_text, fraction_text, fraction_value, listed_text


def _recommendations(pipeline: PipelineConfig, split: Sequence[EdgeName]) -> dict[str, list[tuple[float, EdgeName]]]:
    """Stage -> every (recommended fraction, edge) that the newly split edges recommend for it."""
    found: dict[str, list[tuple[float, EdgeName]]] = {}
    for edge in split:
        for resources in pipeline.process_edge_resources:
            if resources.edge == edge:
                for stage, value in resources.fractions.items():
                    found.setdefault(stage, []).append((value, edge))
    return found


def _apply_recommendations(
    placed: PipelineConfig, recommended: dict[str, list[tuple[float, EdgeName]]], shared: set[int]
) -> tuple[PipelineConfig, dict[str, FractionSource | None], list[str]]:
    """Give recommended fractions to the stages that lack one on a shared GPU; warn where an explicit one is lower.

    Only a stage that would actually receive a value can have conflicting
    recommendations: an explicit fraction decides for itself, and a CPU stage
    or one alone on its GPU needs none.
    """
    warnings: list[str] = []
    sources: dict[str, FractionSource | None] = {
        s.name: "declared" if s.fraction is not None else None for s in placed.stages
    }
    stages: list[StageConfig] = []
    for stage in placed.stages:
        on_shared = sorted(shared & set(stage.gpus))
        candidates = recommended.get(stage.name, [])
        if candidates and on_shared:
            if stage.fraction is None:
                (value, edge), *rest = candidates
                for other_value, other_edge in rest:
                    if abs(other_value - value) > TOLERANCE:
                        raise PlacementError(
                            ErrorCode.CONFLICTING_RECOMMENDATION,
                            f"stage {stage.name!r} declares no total_gpu_memory_fraction and shares GPU "
                            f"{on_shared[0]} after placement, but splitting {edge_text(edge)} recommends "
                            f"{fraction_text(value)} for it while splitting {edge_text(other_edge)} recommends "
                            f"{fraction_text(other_value)}; declare {stage.name!r}'s total_gpu_memory_fraction "
                            "in a YAML config to decide",
                            stages=[stage.name],
                            edge=other_edge,
                            gpu=on_shared[0],
                        )
                stage = stage.with_fraction(value)
                sources[stage.name] = "recommended"
            else:
                value, edge = max(candidates, key=lambda c: c[0])
                if stage.fraction < value - TOLERANCE:
                    warnings.append(
                        f"stage {stage.name!r} declares total_gpu_memory_fraction {fraction_text(stage.fraction)}, "
                        f"below the {fraction_text(value)} the model recommends when {edge_text(edge)} is split"
                    )
        stages.append(stage)
    return placed.model_copy(update={"stages": tuple(stages)}), sources, warnings


def plan_pipeline(
    declared: PipelineConfig,
    *,
    baseline: PipelineConfig | None = None,
    placement: PlacementConfig | None = None,
    isolate_stages: Sequence[str] = (),
    stage_processes: Sequence[str] = (),
    model: str | None = None,
    model_path: str | None = None,
    unsafe_reasons: Mapping[EdgeName, str | None] | None = None,
    runtime_fraction_args: Mapping[str, Sequence[str]] | None = None,
    source: str = "pipeline",
    replicas: Sequence[ReplicaRequest] = (),
) -> Plan:
    """The pure planner: an already-merged pipeline plus placement options -> a Plan.

    `declared` is the topology before CLI options (model + YAML); `baseline` is
    the model's built-in topology that safety is judged against (defaults to
    `declared`, as for a pipeline declared in full). `runtime_fraction_args`
    names, per stage, engine memory arguments beyond the well-known ones.
    """
    placement = placement or PlacementConfig()
    in_full = baseline is None  # a pipeline its config declares whole, no model's
    baseline = baseline or declared
    check_structure(declared, source)
    assignments = parse_assignments(isolate_stages, stage_processes)
    placed = apply_assignments(declared, assignments)
    try:
        check_process_names(placed)
    except PlacementError as error:
        # check_structure passed the declared names: this collision comes from a placement option.
        raise error.about(()) from None
    moved = any(p.process != d.process for p, d in zip(placed.stages, declared.stages, strict=True))
    changed = moved or any(r.replicas != r.declared for r in replicas)

    crossing = crossing_links(placed)
    safe = set(declared.process_safe_edges)
    baseline_crossing = set(crossing_links(baseline))
    newly_crossing = [e for e in crossing if e not in baseline_crossing]
    unsafe = [e for e in newly_crossing if e not in safe]
    if unsafe:
        raise _unsafe_edge_error(
            declared, baseline, unsafe, safe, unsafe_reasons or {}, in_full, split_in_file=set(crossing_links(declared))
        )

    # Recommendations apply only to what the CLI options newly split.
    declared_crossing = set(crossing_links(declared))
    split_by_options = [e for e in crossing if e not in declared_crossing] if moved else []
    recommended = _recommendations(placed, split_by_options)
    try:
        laid_out = layout_groups(placed)
    except PlacementError as error:
        raise _option_spans_gpus(error, declared, placed, assignments) from None
    groups = replicate(laid_out, replicas)
    shared = {gpu for gpu, users in gpu_users(groups).items() if len(users) > 1}

    placed, sources, warnings = _apply_recommendations(placed, recommended, shared)

    for edge in crossing:
        if edge not in safe and edge not in newly_crossing:
            warnings.append(f"{edge_text(edge)} crosses processes as declared but is not listed in process_safe_edges")

    try:
        check_fractions_declared(placed, groups, crossing, in_full=in_full)
    except PlacementError as error:
        raise _fraction_split_in_file(error, declared, baseline, placed, groups, in_full) from None
    check_limits(
        gpu_fractions(placed),
        groups,
        placement.max_total_gpu_memory_fraction_per_gpu,
        recommended={name for name, source in sources.items() if source == "recommended"},
        where="under `pipeline.stages` in the config"
        if in_full
        else "under `stages:` in a YAML config passed with --config",
    )
    # Last: compared with the effective fractions, recommendations included.
    warnings += check_runtime_fractions(placed, groups, placement.strict_runtime_fractions, runtime_fraction_args)
    return _assemble(placed, groups, crossing, safe, placement, sources, warnings, changed, model, model_path)


def _option_spans_gpus(
    error: PlacementError, declared: PipelineConfig, placed: PipelineConfig, assignments: Sequence[Assignment]
) -> PlacementError:
    """GROUP_SPANS_GPUS as the placement options caused it: naming the options that moved a stage into the process,
    not the config's `gpu:` entry (which is fine as declared); the error unchanged when no option moved one."""
    if error.code is not ErrorCode.GROUP_SPANS_GPUS:
        return error
    moved = {s.name for s, d in zip(placed.stages, declared.stages, strict=True) if s.process != d.process}
    options = {
        a: stage
        for a in assignments
        if (stage := resolve_stage(declared, a.stage, a.option)) in moved & set(error.stages)
    }
    if not options:
        return error
    process = placed.stage(next(iter(options.values()))).process
    on = ", ".join(f"{name!r} on GPU {placed.stage(name).gpus[0]}" for name in error.stages)
    return PlacementError(
        ErrorCode.GROUP_SPANS_GPUS,
        f"{' and '.join(a.option for a in options)} would put stages on different GPUs in process {process!r} "
        f"({on}); a process binds one GPU, so name another process for the stage on the other GPU, or drop the "
        "option",
        stages=error.stages,
        gpu=error.gpu,
    )


def _fraction_split_in_file(
    error: PlacementError,
    declared: PipelineConfig,
    baseline: PipelineConfig,
    placed: PipelineConfig,
    groups: tuple[ProcessGroup, ...],
    in_full: bool,
) -> StagevisorError:
    """MISSING_FRACTION at the config's `process:` entry that split the shared GPU: the first stage on it whose
    process the file chose apart from the others there (a model's stage the file moved out of its process; in a
    pipeline declared in full, a stage beside the GPU's first process) and no placement option moved. Unchanged
    where an option's split or replicas alone share the GPU: no entry of the file caused it."""
    if error.code is not ErrorCode.MISSING_FRACTION or error.config_path:
        return error
    on_gpu = {name for g in groups if any(w.gpu == error.gpu for w in g.workers()) for name in g.stages}
    before = {b.name: group_key(b) for b in baseline.stages}
    stages = [(i, s) for i, s in enumerate(declared.stages) if s.name in on_gpu]
    first = group_key(stages[0][1]) if stages else ""
    for index, stage in stages:
        if group_key(placed.stages[index]) != group_key(stage):
            continue  # a placement option moved it, not the file
        if (group_key(stage) != first) if in_full else (before.get(stage.name) != group_key(stage)):
            return error.about(("stages", index, "process"))
    return error


def _unsafe_edge_error(
    declared: PipelineConfig,
    baseline: PipelineConfig,
    unsafe: Sequence[EdgeName],
    safe: set[EdgeName],
    reasons: Mapping[EdgeName, str | None],
    in_full: bool,
    split_in_file: set[EdgeName],
) -> PlacementError:
    """UNSAFE_EDGE for the first unsafe edge, with advice the operator can follow: every stage that must share the
    process (handoffs that may not cross chain them), what a tensor-parallel stage among them means, and for a
    pipeline declared in full, its own list of safe edges. A split the config file made points at its entry."""
    edge = unsafe[0]
    default = (
        "the pipeline does not list this handoff in process_safe_edges"
        if in_full
        else "the model does not declare this handoff process-safe"
    )
    reason = reasons.get(edge) or default
    also = f" (also unsafe: {', '.join(edge_text(e) for e in unsafe[1:])})" if unsafe[1:] else ""
    # The stages chained to the edge by handoffs that may not cross: all of them must share one process.
    together = set(edge)
    grew = True
    while grew:
        grew = False
        for link in declared.links():
            if link not in safe and (link[0] in together) != (link[1] in together):
                together.update(link)
                grew = True
    names = [s.name for s in declared.stages if s.name in together]
    tensor_parallel = [s for s in declared.stages if s.name in together and s.tp_size > 1]
    if tensor_parallel:
        stage = tensor_parallel[0]
        advice = (
            f"{stage.name!r} is tensor-parallel (tp_size {stage.tp_size}): its ranks run in processes of their own, "
            f"so no stage shares one with it; run {stage.name!r} with tp_size 1 to keep {listed_text(names)} in one "
            "process"
        )
    else:
        advice = f"Keep {listed_text(names)} in the same process"
    if in_full:
        advice += (
            f", or, if the handoff carries only data another process can read, list [{edge[0]}, {edge[1]}] under "
            "pipeline.process_safe_edges"
        )
    config_path: tuple[str | int, ...] = ()
    if edge in split_in_file:  # the config's own placement split it, not a command-line option
        before = {b.name: group_key(b) for b in baseline.stages}
        moved = {s.name for s in declared.stages if before.get(s.name) != group_key(s)}
        index = next((i for i, s in enumerate(declared.stages) if s.name in edge and s.name in moved), None)
        if index is not None:
            config_path = ("stages", index, "process")
    return PlacementError(
        ErrorCode.UNSAFE_EDGE,
        f"{edge_text(edge)} cannot cross a process boundary in {declared.name!r}: {reason}{also}. {advice}.",
        stages=list(edge),
        edge=edge,
        config_path=config_path,
    )


def _edge_kinds(stage: StageConfig) -> tuple[tuple[EdgeKind, tuple[str, ...]], ...]:
    """A stage's links by kind: its `next` targets, then its `stream_to` targets."""
    return (("next", stage.next), ("stream_to", stage.stream_to))


def _assemble(
    placed: PipelineConfig,
    groups: tuple[ProcessGroup, ...],
    crossing: Sequence[EdgeName],
    safe: set[EdgeName],
    placement: PlacementConfig,
    sources: Mapping[str, FractionSource | None],
    warnings: list[str],
    changed: bool,
    model: str | None,
    model_path: str | None,
) -> Plan:
    by_name = {s.name: s for s in placed.stages}
    planned = tuple(
        PlannedStage(
            name=s.name,
            process=s.process or s.name,
            gpu=s.gpu if s.tp_size > 1 else (s.gpus[0] if s.gpus else None),
            tp_size=s.tp_size,
            total_gpu_memory_fraction=s.fraction,
            fraction_source=sources[s.name] if s.fraction is not None else None,
            factory=s.factory,
            args=dict(s.args),
            next=tuple(s.next),
            stream_to=tuple(s.stream_to),
        )
        for s in placed.stages
    )
    process_groups = []
    for group in groups:
        fractions = [f for n in group.stages if by_name[n].gpus and (f := by_name[n].fraction) is not None]
        process_groups.append(
            replace(group, total_gpu_memory_fraction=fraction_value(sum(fractions)) if fractions else None)
        )
    crossing_set = set(crossing)
    edges = tuple(
        Edge(s.name, dst, kind, (s.name, dst) in crossing_set, (s.name, dst) in safe)
        for s in placed.stages
        for kind, targets in _edge_kinds(s)
        for dst in targets
    )
    totals = declared_totals(gpu_fractions(placed), groups)
    gpus = tuple(
        GpuBudget(gpu, _reported(totals[gpu]), placement.max_total_gpu_memory_fraction_per_gpu, users)
        for gpu, users in gpu_users(groups).items()
    )
    return Plan(
        model=model,
        model_path=model_path,
        changed=changed,
        stages=planned,
        groups=tuple(process_groups),
        edges=edges,
        gpus=gpus,
        warnings=tuple(warnings),
    )


def _reported(total: float | None) -> float | None:
    return None if total is None else fraction_value(total)


def resolve_declaration(
    model_path: str | None, config: ConfigFile | None, config_path: str | None
) -> "ModelDeclaration":
    """The model declaration that --model-path (else the config's model_path) selects; the two must agree."""
    from stagevisor.models.registry import resolve_model

    if model_path is None and config is not None and config.model_path is not None:
        try:
            return resolve_model(config.model_path)
        except ConfigError as error:
            raise error.about(("model_path",)) from None
    declaration = resolve_model(model_path)
    if model_path is not None and config is not None and config.model_path is not None:
        try:
            from_config = resolve_model(config.model_path)
        except ConfigError as error:
            raise error.about(("model_path",)) from None
        if from_config.key != declaration.key:
            raise ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"--model-path {model_path!r} selects {declaration.key!r} but {config_path} names model_path "
                f"{config.model_path!r} ({from_config.key!r}); its stage overrides are for that model. "
                "Drop one of the two.",
                config_path=("model_path",),
            )
    return declaration


def rescale(plan: Plan, group: str, replicas: int) -> Plan:
    """The Plan with `group` running `replicas` workers, judged by the GPU rules `plan` applies.

    For `stagevisor scale` at run time. TP_STAGE for a tensor-parallel group,
    MISSING_PROCESS for an unknown one, MISSING_FRACTION / OVER_LIMIT when the
    replicas would not fit their GPUs, OUTSIDE_AUTOSCALE_BOUNDS for an autoscaled
    group asked for a count its autoscaler would undo. A group declared with
    `gpus` keeps spreading over them, round robin from its stages' GPU.
    """
    try:
        count = check_replicas(replicas)
    except ValueError as error:
        raise PlacementError(ErrorCode.MALFORMED_ASSIGNMENT, f"scale {group}={replicas}: {error}") from None
    bounds = next((g.autoscale for g in plan.groups if g.name == group), None)
    if bounds is not None and not bounds.min_replicas <= count <= bounds.max_replicas:
        # The autoscaler, which also scales through here, never leaves its bounds: only an operator meets this.
        raise PlacementError(
            ErrorCode.OUTSIDE_AUTOSCALE_BOUNDS,
            f"scale {group}={count}: group {group!r} is autoscaled between {bounds.min_replicas} and "
            f"{bounds.max_replicas} replicas, and its autoscaler would undo {count} at once; give a count in "
            f"that range, or change processes.{group}.autoscale in the config and `stagevisor apply` it",
        )
    spread = next((g.spread_gpus for g in plan.groups if g.name == group and g.spread_gpus), None)
    request = ReplicaRequest(group, count, spread, f"scale {group}={count}", running=True)
    layouts = replicate(plan.groups, (request,))
    fractions = {s.name: s.total_gpu_memory_fraction for s in plan.stages if s.gpu is not None}
    limit = plan.gpus[0].limit if plan.gpus else 1.0
    check_fractions_present(
        fractions, layouts, lambda _, __: "replicas on a shared GPU each need their group's fraction"
    )
    check_limits(fractions, layouts, limit)
    groups = tuple(
        replace(g, replicas=layout.replicas, replica_gpus=layout.replica_gpus, spread_gpus=layout.spread_gpus)
        if g.name == group
        else g
        for g, layout in zip(plan.groups, layouts, strict=True)
    )
    totals = declared_totals(fractions, layouts)
    budgets = tuple(GpuBudget(gpu, _reported(totals[gpu]), limit, users) for gpu, users in gpu_users(layouts).items())
    return replace(plan, groups=groups, gpus=budgets)


def apply_autoscale(plan: Plan, config: ConfigFile | None, source: str) -> Plan:
    """Each `processes.<name>.autoscale` onto its group: its starting replicas within the bounds, and its
    maximum judged now by the rules `scale` applies, so the autoscaler never meets a refusal at run time."""
    for name, settings in (config.processes if config is not None else {}).items():
        bounds = settings.autoscale
        if bounds is None:
            continue
        where = f"{source}: processes.{name}.autoscale"
        # replica_requests already refused a process the plan does not have, or one of a TP stage's ranks.
        group = plan.group(name)
        if not bounds.min_replicas <= group.replicas <= bounds.max_replicas and group.replicas != 1:
            raise ConfigError(
                ErrorCode.INVALID_CONFIG,
                f"{where}: group {name!r} is given {group.replicas} replicas, outside the autoscale bounds "
                f"[{bounds.min_replicas}, {bounds.max_replicas}]; drop the replica count or widen the bounds",
                config_path=("processes", name, "autoscale"),
            )
        try:
            rescale(plan, name, bounds.max_replicas)
        except PlacementError as error:
            raise PlacementError(
                error.code,
                f"{where}: max_replicas {bounds.max_replicas} would not fit: {error.message}",
                stages=error.stages,
                gpu=error.gpu,
                config_path=("processes", name, "autoscale", "max_replicas"),
            ) from None
        start = min(max(group.replicas, bounds.min_replicas), bounds.max_replicas)
        if start != group.replicas:
            plan = rescale(plan, name, start)
        rule = Autoscale(**bounds.model_dump())
        plan = replace(plan, groups=tuple(replace(g, autoscale=rule) if g.name == name else g for g in plan.groups))
    return plan
