"""`stagevisor check --verify-edges`: is an edge process-safe? Run it both ways and compare.

For each edge `src -> dst`, the same deterministic requests run through real
worker processes twice: with every stage in one process, and with the
pipeline cut at the edge (dst and everything downstream of it in a second
process). The audio must be byte-identical and neither run may fail. A
process-local handoff (a registry or queue one stage fills and the next one
reads) shows up as a failure of the receiving stage in the split run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from stagevisor.supervisor.daemon import Daemon, DaemonOptions
from stagevisor.supervisor.dataplane.synthesis import to_pcm16
from stagevisor.supervisor.errors import RequestFailed, StagevisorError
from stagevisor.supervisor.plan import Edge, Plan, ProcessGroup

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
        groups.append(ProcessGroup(name=name, stages=tuple(s.name for s in members),
                                   gpu=min(gpus) if gpus else None,
                                   total_gpu_memory_fraction=min(1.0, sum(fractions)) if fractions else None))
    where = {s.name: s.process for s in stages}
    edges = tuple(dataclasses.replace(e, cross_process=where[e.src] != where[e.dst]) for e in plan.edges)
    return dataclasses.replace(plan, stages=stages, groups=tuple(groups), edges=edges, gpus=())


@dataclass
class Outcome:
    """What one run of the requests produced: PCM per request, or the first failure."""

    pcm: list[bytes]
    failure: str | None = None


@dataclass
class EdgeVerdict:
    src: str
    dst: str
    declared_safe: bool
    identical: bool
    difference: str | None
    also_split: tuple[tuple[str, str], ...] = ()

    @property
    def mismatch(self) -> bool:
        """Declared safe but behaved differently: an error in the model's declaration."""
        return self.declared_safe and not self.identical

    def to_json(self) -> dict[str, Any]:
        return {"edge": [self.src, self.dst], "declared_safe": self.declared_safe, "identical": self.identical,
                "difference": self.difference, "also_split": [list(e) for e in self.also_split]}


async def run_requests(plan: Plan, requests: Sequence[dict[str, Any]], *, import_paths: tuple[str, ...] = (),
                       timeout: float = 120.0) -> Outcome:
    """Start a daemon on `plan` (workers are real processes), run `requests` one by one, stop it."""
    with tempfile.TemporaryDirectory(prefix="svcheck") as tmp:
        options = DaemonOptions(admin_address=f"unix:{tmp}/admin.sock", run_dir=Path(tmp) / "run",
                                log_level="WARNING", stop_timeout=5.0, max_restarts=0, drain_timeout=0.0,
                                import_paths=import_paths)
        daemon = Daemon(plan, options)
        try:
            try:
                await asyncio.wait_for(daemon.start(), timeout)
            except Exception as error:  # StartupError: a stage failed to build in this topology
                return Outcome([], f"the pipeline did not start: {error}")
            pcm: list[bytes] = []
            for request in requests:
                handle = daemon.gateway.open(request)  # type: ignore[attr-defined]
                audio = bytearray()

                async def collect() -> None:
                    async for chunk in handle:
                        audio.extend(to_pcm16(chunk["audio"]))

                try:
                    await asyncio.wait_for(collect(), timeout)
                except RequestFailed as failure:
                    return Outcome(pcm, f"the request failed: {failure.status}: {failure.message}")
                except asyncio.TimeoutError:
                    return Outcome(pcm, f"the request did not finish within {timeout:g} s")
                finally:
                    handle.close()
                pcm.append(bytes(audio))
            return Outcome(pcm)
        finally:
            await daemon.shutdown(0.0)


def first_difference(together: Outcome, split: Outcome) -> str | None:
    if together.failure:
        return f"the single-process run failed too, so the edge cannot be judged: {together.failure}"
    if split.failure:
        return split.failure
    for index, (a, b) in enumerate(zip(together.pcm, split.pcm)):
        if a != b:
            if len(a) != len(b):
                return f"request {index + 1}: {len(b) // 2} samples instead of {len(a) // 2}"
            at = next(i for i in range(0, len(a), 2) if a[i:i + 2] != b[i:i + 2]) // 2
            return f"request {index + 1}: audio differs from sample {at}"
    return None


async def verify_edges(plan: Plan, requests: Sequence[dict[str, Any]], edges: Sequence[tuple[str, str]] | None = None,
                       *, import_paths: tuple[str, ...] = ()) -> list[EdgeVerdict]:
    """One verdict per `next` edge of the plan (or per edge in `edges`), in config order."""
    if any(s.tp_size > 1 for s in plan.stages):
        raise StagevisorError("TP_STAGE", "--verify-edges cannot move tensor-parallel stages between processes")
    declared = {(e.src, e.dst): e.process_safe for e in plan.edges}
    candidates = [(e.src, e.dst) for e in plan.edges if e.kind == "next"]
    if edges:
        unknown = [e for e in edges if e not in declared]
        if unknown:
            raise StagevisorError("UNKNOWN_STAGE", "no edge " + ", ".join(f"{s!r} -> {d!r}" for s, d in unknown)
                                  + " in this pipeline; its edges: "
                                  + ", ".join(f"{s},{d}" for s, d in candidates))
        candidates = [e for e in candidates if e in set(edges)]
    together_plan = regroup(plan, {s.name: TOGETHER for s in plan.stages})
    together = await run_requests(together_plan, requests, import_paths=import_paths)
    verdicts = []
    for src, dst in candidates:
        after = set(downstream_of(plan, dst))
        split_plan = regroup(plan, {s.name: AFTER if s.name in after else TOGETHER for s in plan.stages})
        crossing = tuple((e.src, e.dst) for e in split_plan.edges
                         if e.cross_process and e.kind == "next" and (e.src, e.dst) != (src, dst))
        split = await run_requests(split_plan, requests, import_paths=import_paths)
        difference = first_difference(together, split)
        verdicts.append(EdgeVerdict(src, dst, declared[(src, dst)], difference is None, difference, crossing))
    return verdicts
