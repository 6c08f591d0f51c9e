"""The operator's placement options (--stage-process, --isolate-stage, --process-replicas, `processes:`), parsed
and applied to a pipeline. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from stagevisor.supervisor.config import NAME_PATTERN, ConfigFile, PipelineConfig, replicas_from_text
from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.groups import ReplicaRequest, group_key
from stagevisor.supervisor.placement.wording import names_text


@dataclass(frozen=True)
class Assignment:
    """One placement request: put `stage` (as typed) into `process`."""

    option: str
    """The option as the operator wrote it, for messages."""
    stage: str
    process: str
    isolate: bool


def parse_assignments(isolate_stages: Sequence[str], stage_processes: Sequence[str]) -> tuple[Assignment, ...]:
    """Parse the CLI options; MALFORMED_ASSIGNMENT for anything but `STAGE=GROUP` / `STAGE`."""
    parsed = []
    for raw in stage_processes:
        option = f"--stage-process {raw!r}"
        parts = raw.split("=")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise PlacementError(
                ErrorCode.MALFORMED_ASSIGNMENT,
                f"{option} is malformed; write STAGE=GROUP, e.g. --stage-process vocoder=vocoder",
            )
        stage, process = parts[0].strip(), parts[1].strip()
        _check_option_name(option, process, "process")
        parsed.append(Assignment(option, stage, process, isolate=False))
    for raw in isolate_stages:
        option = f"--isolate-stage {raw!r}"
        stage = raw.strip()
        if not stage or "=" in stage:
            raise PlacementError(
                ErrorCode.MALFORMED_ASSIGNMENT,
                f"{option} is malformed; name one stage, e.g. --isolate-stage vocoder "
                "(use --stage-process STAGE=GROUP to choose the process group's name)",
            )
        _check_option_name(option, stage, "stage")
        parsed.append(Assignment(option, stage, stage, isolate=True))
    return tuple(parsed)


def parse_replica_options(process_replicas: Sequence[str]) -> tuple[ReplicaRequest, ...]:
    """Parse `--process-replicas GROUP=N`; MALFORMED_ASSIGNMENT for anything else, DUPLICATE_ASSIGNMENT twice."""
    parsed: dict[str, ReplicaRequest] = {}
    for raw in process_replicas:
        option = f"--process-replicas {raw!r}"
        parts = raw.split("=")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise PlacementError(
                ErrorCode.MALFORMED_ASSIGNMENT,
                f"{option} is malformed; write GROUP=N, e.g. --process-replicas vocoder=2",
            )
        process, count = parts[0].strip(), parts[1].strip()
        _check_option_name(option, process, "process")
        try:
            replicas = replicas_from_text(count)
        except ValueError as error:
            raise PlacementError(ErrorCode.MALFORMED_ASSIGNMENT, f"{option}: {error}") from None
        if process in parsed:
            raise PlacementError(
                ErrorCode.DUPLICATE_ASSIGNMENT,
                f"process {process!r} is given replicas twice ({parsed[process].origin} and {option}); name it once",
            )
        parsed[process] = ReplicaRequest(process, replicas, None, option)
    return tuple(parsed.values())


def replica_requests(
    config: ConfigFile | None, source: str, process_replicas: Sequence[str]
) -> tuple[ReplicaRequest, ...]:
    """The YAML `processes:` entries, with `--process-replicas` overriding the count of the same process."""
    options = {r.process: r for r in parse_replica_options(process_replicas)}
    requests = []
    for name, settings in (config.processes if config else {}).items():
        option = options.pop(name, None)
        origin = f"{source}: processes.{name}" + (f" with {option.origin}" if option else "")
        count = option.replicas if option else settings.replicas
        requests.append(
            ReplicaRequest(name, count, settings.gpus, origin, ("processes", name), declared=settings.replicas)
        )
    return (*requests, *options.values())


def _check_option_name(option: str, name: str, what: str) -> None:
    if not NAME_PATTERN.match(name):
        raise PlacementError(
            ErrorCode.MALFORMED_ASSIGNMENT,
            f"{option}: {what} name {name!r} is not valid; use letters, digits, '_', '.', '-' and start with a "
            "letter or digit",
        )


def resolve_stage(pipeline: PipelineConfig, name: str, option: str) -> str:
    """A literal stage name first, then a role alias; UNKNOWN_STAGE otherwise."""
    if name in pipeline.stage_names:
        return name
    if name in pipeline.role_aliases:
        return pipeline.role_aliases[name]
    aliases = (
        f"; role aliases: {', '.join(f'{a} -> {t}' for a, t in pipeline.role_aliases.items())}"
        if pipeline.role_aliases
        else ""
    )
    raise PlacementError(
        ErrorCode.UNKNOWN_STAGE,
        f"{option}: {pipeline.name!r} has no stage or role {name!r}; stages: {names_text(pipeline.stage_names)}"
        f"{aliases}",
        stages=[name],
    )


def apply_assignments(pipeline: PipelineConfig, assignments: Sequence[Assignment]) -> PipelineConfig:
    """A copy of the pipeline with the requested processes; the input is left untouched."""
    resolved: dict[str, Assignment] = {}
    seen: dict[str, Assignment] = {}
    for assignment in assignments:
        stage = resolve_stage(pipeline, assignment.stage, assignment.option)
        if stage in seen:
            raise PlacementError(
                ErrorCode.DUPLICATE_ASSIGNMENT,
                f"stage {stage!r} is placed twice ({seen[stage].option} and {assignment.option}); "
                "name each stage once across --isolate-stage and --stage-process",
                stages=[stage],
            )
        seen[stage] = assignment
        if pipeline.stage(stage).tp_size > 1:
            declared_process = pipeline.stage(stage).process or stage
            if _alone_request(assignment) or assignment.process == declared_process:
                continue  # its ranks already run alone, in processes named after this: a no-op
            raise PlacementError(
                ErrorCode.TP_STAGE,
                f"{assignment.option}: stage {stage!r} is tensor-parallel (tp_size "
                f"{pipeline.stage(stage).tp_size}) and runs one process per rank; it cannot be moved "
                "by placement options (isolating it, or naming its own process, is a no-op: its ranks run alone)",
                stages=[stage],
            )
        resolved[stage] = assignment

    declared = {s.name: s.process for s in pipeline.stages}
    process = dict(declared)
    for stage, assignment in resolved.items():
        process[stage] = assignment.process
    # `--isolate-stage X` is `--stage-process X=X` (either way written), except
    # for a stage the declared topology already runs alone: that request is a
    # no-op and keeps the declared process name. "Alone" is judged on the
    # declared topology, never on the map after other options, so the result
    # does not depend on option order; it stays a no-op only while no other
    # stage is moved in, nor into the process it names.
    key = {s.name: group_key(s) for s in pipeline.stages}
    already_alone = {
        stage
        for stage, assignment in resolved.items()
        if _alone_request(assignment) and not any(key[o] == key[stage] for o in key if o != stage)
    }
    # Stages already alone sit in distinct declared processes, so only the
    # other (non-TP) stages' targets can move into one of them.
    tp = {s.name for s in pipeline.stages if s.tp_size > 1}
    moved_in = {process[o] for o in process if o not in already_alone and o not in tp}
    named = {resolved[o].process for o in resolved if o not in already_alone and o not in tp}
    for stage in already_alone:
        if declared[stage] not in moved_in and resolved[stage].process not in named:
            process[stage] = declared[stage]
    for stage, assignment in resolved.items():
        if assignment.isolate:  # `--stage-process` may group stages, in a process named after one of them too
            # A TP stage's process name only prefixes its ranks' names: it shares no process.
            others = [o for o in process if o != stage and o not in tp and process[o] == process[stage]]
            if others:
                raise PlacementError(
                    ErrorCode.NAME_COLLISION,
                    f"{assignment.option} would put {stage!r} in process {process[stage]!r}, which also holds "
                    f"{names_text(others)}; --isolate-stage only makes a singleton, use --stage-process "
                    "to group stages",
                    stages=[stage, *others],
                )
    stages = tuple(
        s if process[s.name] == s.process else s.model_copy(update={"process": process[s.name]}, deep=True)
        for s in pipeline.stages
    )
    return pipeline.model_copy(update={"stages": stages})


def _alone_request(assignment: Assignment) -> bool:
    """`--isolate-stage X`, or `--stage-process X=X`, its long form: X in a process of its own."""
    return assignment.isolate or assignment.process == assignment.stage
