"""`stagevisor check --verify-edges`: is an edge process-safe? Run it both ways and compare.

For each edge `src -> dst`, the same deterministic requests run through real
worker processes twice: with every stage in one process, and with the
pipeline cut at the edge (dst and everything downstream of it in a second
process). Workers record every payload their stages receive along every edge
(supervisor/worker/handoffs.py): the `next` data, each stream chunk, the data that
comes with a stream's end. The two runs must agree on every one of them, field
by field (tensors by value), and on the audio byte for byte, and neither may
fail. A process-local handoff (a registry or queue one stage fills and the
next one reads) shows up as a failure of the receiving stage, or as a payload
field that differs, in the split run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from stagevisor.supervisor.daemon.core import Daemon
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.dataplane.client_failures import STAGE_FAILURE_LOGGED
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.synthesis import to_pcm16
from stagevisor.supervisor.errors import ErrorCode, RequestFailed, StagevisorError
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.worker.handoffs import CHUNK, END, NEXT, read_handoffs
from stagevisor.supervisor.worker.handoffs import first_difference as compare_values
from stagevisor.supervisor.plan import Plan, ProcessGroup

MAX_JOBS = 4
GATEWAY_LOGGER = "stagevisor.supervisor.dataplane.gateway"
TOGETHER = "check_together"
AFTER = "check_split"


def downstream_of(plan: Plan, stage: str) -> list[str]:
    """`stage` and every stage reachable from it along `next`, in config order."""
    seen = {stage}
    todo = [stage]
    while todo:
        for nxt in plan.stage(todo.pop()).next:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return [s.name for s in plan.stages if s.name in seen]


def regroup(plan: Plan, processes: dict[str, str]) -> Plan:
    """A copy of `plan` with stages placed in `processes`, for an experiment only (no placement rules)."""
    stages = tuple(dataclasses.replace(s, process=processes[s.name]) for s in plan.stages)
    order = list(dict.fromkeys(s.process for s in stages))
    groups = []
    for name in order:
        members = [s for s in stages if s.process == name]
        gpus = {s.gpu for s in members if isinstance(s.gpu, int)}
        fractions = [s.total_gpu_memory_fraction for s in members if s.total_gpu_memory_fraction]
        groups.append(
            ProcessGroup(
                name=name,
                stages=tuple(s.name for s in members),
                gpu=min(gpus) if gpus else None,
                total_gpu_memory_fraction=min(1.0, sum(fractions)) if fractions else None,
            )
        )
    where = {s.name: s.process for s in stages}
    edges = tuple(dataclasses.replace(e, cross_process=where[e.src] != where[e.dst]) for e in plan.edges)
    return dataclasses.replace(plan, stages=stages, groups=tuple(groups), edges=edges, gpus=())


Handoff = tuple[str, str, str, Any]
"""(src, dst, what, canonical value) of one recorded handoff; `what` is handoffs.NEXT, CHUNK or END."""


@dataclass
class Outcome:
    """What one run of the requests produced: PCM and recorded handoffs per request, or the first failure."""

    pcm: list[bytes]
    failure: str | None = None
    failed_stage: str = ""
    handoffs: list[list[Handoff]] = field(default_factory=list)
    """Per request (in order), what the stages received along each edge, in the order they received it."""


@dataclass
class EdgeVerdict:
    src: str
    dst: str
    declared_safe: bool
    identical: bool
    difference: str | None
    also_split: tuple[tuple[str, str], ...] = ()
    differing_field: dict[str, Any] | None = None
    """The first payload field that differs: edge, request, path, and both values (bounded)."""

    @property
    def mismatch(self) -> bool:
        """Declared safe but behaved differently: an error in the model's declaration."""
        return self.declared_safe and not self.identical

    def to_json(self) -> dict[str, Any]:
        return {
            "edge": [self.src, self.dst],
            "declared_safe": self.declared_safe,
            "identical": self.identical,
            "difference": self.difference,
            "differing_field": self.differing_field,
            "also_split": [list(e) for e in self.also_split],
        }


async def run_requests(
    plan: Plan,
    requests: Sequence[dict[str, Any]],
    *,
    import_paths: tuple[str, ...] = (),
    timeout: float = 120.0,
    start_timeout: float = 300.0,
    causes: dict[str, str] | None = None,
) -> Outcome:
    """Start a daemon on `plan` (workers are real processes), run `requests` one by one, stop it.

    The workers record what their stages receive (handoffs.py) in the daemon's private directory.
    `causes` maps a failed request's id to its stage's own message, where the caller collects them.
    """
    with tempfile.TemporaryDirectory(prefix="svcheck") as tmp:
        record = Path(tmp) / "handoffs"
        record.mkdir()
        options = DaemonOptions(
            admin_address=f"unix:{tmp}/admin.sock",
            run_dir=Path(tmp) / "run",
            log_level="WARNING",
            stop_timeout=5.0,
            max_restarts=0,
            drain_timeout=0.0,
            import_paths=import_paths,
            metrics=False,
            record_handoffs=str(record),
        )
        daemon = Daemon(plan, options, gateway_factory=Gateway)
        outcome = Outcome([])
        ids: list[str] = []
        try:
            try:
                await asyncio.wait_for(daemon.start(), start_timeout)
            except Exception as error:  # StartupError: a stage failed to build in this topology
                outcome.failure = f"the pipeline did not start: {error}"
                return outcome
            for request in requests:
                handle = daemon.gateway.open(request)
                ids.append(handle.request_id)
                audio = bytearray()

                try:
                    await asyncio.wait_for(_collect(handle, audio), timeout)
                except RequestFailed as failure:
                    cause = (causes or {}).get(failure.request_id or handle.request_id)
                    outcome.failure, outcome.failed_stage = _cause(failure, cause), failure.stage
                    break
                except asyncio.TimeoutError:
                    outcome.failure = f"the request did not finish within {timeout:g} s"
                    break
                finally:
                    handle.close()
                outcome.pcm.append(bytes(audio))
            return outcome
        finally:
            await daemon.shutdown(0.0)
            # Read after the workers are gone: every record is complete.
            index = {request_id: number for number, request_id in enumerate(ids)}
            outcome.handoffs = [[] for _ in ids]
            for request_id, src, dst, what, value in read_handoffs(record):
                if request_id in index:
                    outcome.handoffs[index[request_id]].append((src, dst, what, value))


async def _collect(handle: Any, audio: bytearray) -> None:
    """Append a request's audio, as 16-bit PCM, to `audio` until its stream ends."""
    async for chunk in handle:
        audio.extend(to_pcm16(chunk["audio"]))


def _cause(failure: RequestFailed, cause: str | None) -> str:
    """What a failed request says in a verdict: the stage's own words where known, without the stage's name."""
    if cause is None:
        return f"{failure.status}: {failure.message}"
    prefix = f"stage {failure.stage!r} failed: "
    return cause[len(prefix) :] if cause.startswith(prefix) else cause


def _label(what: str, number: int) -> str:
    return {NEXT: "data", CHUNK: f"chunks[{number}]", END: "end data"}[what]


def _payload_difference(plan: Plan, together: list[Handoff], split: list[Handoff]) -> tuple[dict, bool] | None:
    """The first differing handoff field of one request, edge by edge in config order; and whether the
    split run received fewer handoffs on some edge (it failed midway) without any field differing."""
    edges = list(dict.fromkeys((e.src, e.dst) for e in plan.edges))
    by_edge: dict[tuple[str, str], tuple[list, list]] = {edge: ([], []) for edge in edges}
    for side, records in enumerate((together, split)):
        for src, dst, what, value in records:
            by_edge.setdefault((src, dst), ([], []))[side].append((what, value))
    for (src, dst), (ours, theirs) in by_edge.items():
        chunks = 0
        for (what, value), (their_what, their_value) in zip(ours, theirs, strict=False):
            label = _label(what, chunks)
            chunks += what == CHUNK
            if what != their_what:
                return {"edge": [src, dst], "path": label, "in_process": what, "split": their_what}, False
            found = compare_values(value, their_value, "data" if what == NEXT else label)
            if found:
                return {
                    "edge": [src, dst],
                    "path": found.path,
                    "in_process": found.together,
                    "split": found.split,
                }, False
        if len(ours) != len(theirs):
            counts = {
                "edge": [src, dst],
                "path": "chunks",
                "in_process": counted(len(ours), "handoff"),
                "split": counted(len(theirs), "handoff"),
            }
            return counts, len(theirs) < len(ours)
    return None


def first_difference(
    plan: Plan, edge: tuple[str, str], together: Outcome, split: Outcome
) -> tuple[str | None, dict[str, Any] | None]:
    """How the split run differs from the one-process run: a sentence, and the first differing field if any.

    Payload fields come first (what the receiving stage saw), then a failure of the split run, then
    the number of handoffs, then the audio.
    """
    if together.failure:
        return f"the single-process run failed too, so the edge cannot be judged: {together.failure}", None
    for number, (ours, theirs) in enumerate(zip(together.handoffs, split.handoffs, strict=False)):
        found = _payload_difference(plan, ours, theirs)
        if found is None:
            continue
        field_, short = found
        if short and split.failure:
            break  # fewer handoffs because the split run failed: the failure says why
        field_["request"] = number + 1
        where = "" if tuple(field_["edge"]) == edge else f" of edge {field_['edge'][0]} -> {field_['edge'][1]}"
        return (
            f"request {number + 1}: {field_['path']}{where}: {field_['in_process']} in one process, "
            f"{field_['split']} split"
        ), field_
    if split.failure:
        if split.failed_stage == edge[1]:
            return f"the receiving stage {edge[1]!r} failed: {split.failure}", None
        if split.failed_stage:
            return f"stage {split.failed_stage!r} failed: {split.failure}", None
        return f"the request failed: {split.failure}", None
    for index, (a, b) in enumerate(zip(together.pcm, split.pcm, strict=False)):
        if a != b:
            if len(a) != len(b):
                return f"request {index + 1}: {len(b) // 2} samples instead of {len(a) // 2}", None
            at = next(i for i in range(0, len(a), 2) if a[i : i + 2] != b[i : i + 2]) // 2
            return f"request {index + 1}: audio differs from sample {at}", None
    return None, None


def edges_to_verify(plan: Plan, edges: Sequence[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """The `next` edges verify_edges splits, in config order: all of them, or those named in `edges`.

    Pure, so that `stagevisor check` refuses a pipeline or an edge it cannot verify before it builds anything.
    """
    if any(s.tp_size > 1 for s in plan.stages):
        raise StagevisorError(ErrorCode.TP_STAGE, "--verify-edges cannot move tensor-parallel stages between processes")
    candidates = [(e.src, e.dst) for e in plan.edges if e.kind == "next"]
    if not edges:
        return candidates
    listed = ", ".join(f"{s!r} -> {d!r}" for s, d in candidates)
    declared = {(e.src, e.dst) for e in plan.edges}
    unknown = [e for e in edges if e not in declared]
    if unknown:
        raise StagevisorError(
            ErrorCode.UNKNOWN_STAGE,
            "no edge "
            + ", ".join(f"{s!r} -> {d!r}" for s, d in unknown)
            + " in this pipeline; name one of its edges: "
            + listed,
            edge=unknown[0],
        )
    streams_only = [e for e in edges if e not in candidates]
    if streams_only:  # a stream_to edge alone: splitting at its target is the check of the `next` edge into it
        src, dst = streams_only[0]
        raise StagevisorError(
            ErrorCode.UNKNOWN_STAGE,
            f"edge {src!r} -> {dst!r} is a stream_to edge: --edge names a `next` edge, and splitting there carries "
            f"every handoff that crosses, streams included; name one of: {listed}",
            edge=streams_only[0],
        )
    return [e for e in candidates if e in set(edges)]


async def verify_edges(
    plan: Plan,
    requests: Sequence[dict[str, Any]],
    edges: Sequence[tuple[str, str]] | None = None,
    *,
    import_paths: tuple[str, ...] = (),
    jobs: int | None = None,
) -> list[EdgeVerdict]:
    """One verdict per `next` edge of the plan (or per edge in `edges`), in config order.

    The one-process run and every split run are separate daemons, `jobs` of them at once
    (default: default_jobs()); the one-process run is the baseline of every edge.
    """
    declared = {(e.src, e.dst): e.process_safe for e in plan.edges}
    candidates = edges_to_verify(plan, edges)
    together_plan = regroup(plan, {s.name: TOGETHER for s in plan.stages})
    splits = []
    for src, dst in candidates:
        after = set(downstream_of(plan, dst))
        split_plan = regroup(plan, {s.name: AFTER if s.name in after else TOGETHER for s in plan.stages})
        crossing = tuple(
            (e.src, e.dst)
            for e in split_plan.edges
            if e.cross_process and e.kind == "next" and (e.src, e.dst) != (src, dst)
        )
        splits.append((src, dst, split_plan, crossing))
    # Every topology is its own daemon with its own private directories: they can run side by side.
    slots = asyncio.Semaphore(max(1, jobs or default_jobs()))
    causes = _FailureCauses()

    async def run(topology: Plan) -> Outcome:
        async with slots:
            return await run_requests(topology, requests, import_paths=import_paths, causes=causes.causes)

    gateway_log = logging.getLogger(GATEWAY_LOGGER)
    gateway_log.addHandler(causes)
    try:
        # Each run stops its own daemon, whatever happens to the others.
        results = await asyncio.gather(run(together_plan), *(run(p) for _, _, p, _ in splits), return_exceptions=True)
    finally:
        gateway_log.removeHandler(causes)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    together, *outcomes = [r for r in results if not isinstance(r, BaseException)]  # none is, after the raise
    verdicts = []
    for (src, dst, _, crossing), split in zip(splits, outcomes, strict=True):
        difference, field_ = first_difference(plan, (src, dst), together, split)
        verdicts.append(EdgeVerdict(src, dst, declared[(src, dst)], difference is None, difference, crossing, field_))
    return verdicts


def default_jobs() -> int:
    """Topologies run at once by default: one per CPU, at most MAX_JOBS (each starts one or two workers)."""
    return max(1, min(MAX_JOBS, os.cpu_count() or 1))


class _FailureCauses(logging.Handler):
    """The failing stage's own words for each failed request, from the gateway's log.

    Clients get a generic message for a stage's exception (it may hold secrets);
    the gateway logs the cause under the request id, and here the operator who
    runs the check is the one who reads it.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.causes: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == STAGE_FAILURE_LOGGED and len(args) == 4:
            self.causes[str(args[0])] = str(args[3])
