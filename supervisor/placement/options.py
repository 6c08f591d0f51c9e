"""The operator's placement options (--stage-process, --isolate-stage, --process-replicas, `processes:`), parsed
and applied to a pipeline. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from stagevisor.supervisor.config import NAME_PATTERN, ConfigFile, PipelineConfig, replicas_from_text
from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.groups import ReplicaRequest, group_key
from stagevisor.supervisor.placement.wording import listed_text, names_text


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
    given: dict[str, list[str]] = {}
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
        given.setdefault(process, []).append(option)
        parsed.setdefault(process, ReplicaRequest(process, replicas, None, option))
    for process, options in given.items():
        if len(options) > 1:  # every option, by its text (not typing order), and which to drop
            first, *others = sorted(options)
            times = "twice" if len(options) == 2 else f"{len(options)} times"
            raise PlacementError(
                ErrorCode.DUPLICATE_ASSIGNMENT,
                f"process {process!r} is given replicas {times}, by {', '.join([first, *others])}; keep the one "
                f"with the count you want and drop the others (e.g. keep {first} and drop "
                f"{', '.join(others)}), so that each process is named once in --process-replicas",
            )
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
    placing: dict[str, list[Assignment]] = {}
    for assignment in assignments:
        placing.setdefault(resolve_stage(pipeline, assignment.stage, assignment.option), []).append(assignment)
    for stage, options in placing.items():
        if len(options) > 1:
            raise _duplicate_error(stage, options)
    for assignment in assignments:
        stage = resolve_stage(pipeline, assignment.stage, assignment.option)
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


def _duplicate_error(stage: str, options: Sequence[Assignment]) -> PlacementError:
    """DUPLICATE_ASSIGNMENT naming every option that places `stage`, in an order that does not depend on the order
    they were typed in (--isolate-stage first, then each option by its text), and which of them to drop."""
    ordered = sorted(options, key=lambda a: (not a.isolate, a.option))
    processes = dict.fromkeys(a.process for a in ordered)

    def named(assignment: Assignment) -> str:
        role = f", role {assignment.stage!r} is stage {stage!r}" if assignment.stage != stage else ""
        return f"{assignment.option} (process {assignment.process!r}{role})"

    if len(processes) == 1:  # they agree: keep the shortest way to say it
        keep, *drop = ordered
        advice = f"they all name process {keep.process!r}: keep {keep.option} and drop {_options_text(drop)}"
    else:
        advice = (
            f"they name different processes ({listed_text(list(processes))}): keep the one that names the process you "
            "want and drop the others"
        )
    times = "twice" if len(ordered) == 2 else f"{len(ordered)} times"
    return PlacementError(
        ErrorCode.DUPLICATE_ASSIGNMENT,
        f"stage {stage!r} is placed {times} by {', '.join(named(a) for a in ordered)}; {advice}, so "
        "that each stage is named once across --isolate-stage and --stage-process",
        stages=[stage],
    )


def _options_text(options: Sequence[Assignment]) -> str:
    """`--isolate-stage 'a'`, `... and ...`: the options as typed, already quoted."""
    texts = [a.option for a in options]
    return texts[0] if len(texts) == 1 else f"{', '.join(texts[:-1])} and {texts[-1]}"


def _alone_request(assignment: Assignment) -> bool:
    """`--isolate-stage X`, or `--stage-process X=X`, its long form: X in a process of its own."""
    return assignment.isolate or assignment.process == assignment.stage
