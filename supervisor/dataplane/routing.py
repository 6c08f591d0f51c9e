"""The routing table: where each stage a worker serves sends its outputs, worked out once when the worker starts.

The stage runtime's hot path (stage_calls.py) reads a stage's Routing per call
instead of looking at the plan's edges per request: which stages it streams
to, which `next` stages run here (the last one as a direct call, the others
as tasks) and which run in other processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Container, Mapping

from stagevisor.stages.base import Stage, StagePayload
from stagevisor.supervisor.dataplane.trace import IN_PROCESS, hop, runs
from stagevisor.supervisor.metrics.recorder import EdgeStats, Recorder, StageStats
from stagevisor.supervisor.plan import PlannedStage

SINK = ""
"""The `dst` of frames meant for the gateway, i.e. the client."""
GATEWAY_PEER = "gateway"
"""Who the gateway's links to workers say they are (their Hello): a stopping worker's last word goes on those."""


@dataclass
class Routing:
    """Where one local stage's outputs go, worked out once instead of per request."""

    stream_targets: tuple[str, ...]
    """stream_to stages, or the sink for a terminal stage."""
    ends: tuple[tuple[str, bool], ...]
    """(stream_to stage, whether its end marker carries the final data because it is also `next`)."""
    local_next: tuple[tuple[str, str], ...]
    """(stage, its in-process hop string) for each local `next` stage."""
    remote_next: tuple[str, ...]
    terminal: bool
    stats: StageStats | None = None
    """This stage's stats when metrics are on."""
    # Derived once for the in-process hot path in StageCalls.run.
    sends: bool = field(init=False)
    remote: bool = field(init=False)
    """Whether this stage ends streams or submits to another process (its end time may ride with them)."""
    local_tasks: tuple[tuple[str, str], ...] = field(init=False)
    local_direct: tuple[str, str] | None = field(init=False)
    runs: tuple[tuple[str, ...], ...] = ()
    """The trace.Run of each prefix of the chain of direct calls from this stage (trace.runs), set by RoutingTable."""
    direct: tuple[str, Any, "Routing"] | None = None
    """The direct call's stage (from local_direct, so served here), its executor and routing; set by RoutingTable."""

    def __post_init__(self) -> None:
        self.sends = bool(self.ends or self.remote_next or self.terminal)
        self.remote = bool(self.remote_next or self.ends)
        self.local_tasks = self.local_next[:-1]
        self.local_direct = self.local_next[-1] if self.local_next else None


class NoExecutor:
    """Stands in for a stage this worker does not run: calling it fails the request, so StageCalls needs no check."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    async def process(self, payload: StagePayload, ctx: Any) -> None:
        raise LookupError(f"stage {self.stage!r} has no executor in this worker")


def routing_of(spec: PlannedStage, served: Container[str]) -> Routing:
    """A stage's Routing, given the stages this worker serves."""
    plain_next = [d for d in spec.next if d not in spec.stream_to]
    return Routing(
        stream_targets=tuple(spec.stream_to) or (() if spec.next else (SINK,)),
        ends=tuple((d, d in spec.next) for d in spec.stream_to),
        local_next=tuple((d, hop(spec.name, d, IN_PROCESS)) for d in plain_next if d in served),
        remote_next=tuple(d for d in plain_next if d not in served),
        terminal=not spec.next,
    )


class RoutingTable:
    """Every planned stage's Routing, the (executor, routing) plan StageCalls reads, and in-process edge stats."""

    def __init__(
        self, stages: Mapping[str, PlannedStage], executors: Mapping[str, Stage], recorder: Recorder | None
    ) -> None:
        self.by_stage: dict[str, Routing] = {name: routing_of(spec, executors) for name, spec in stages.items()}
        for routing in self.by_stage.values():
            routing.runs = runs(self._direct_hops(routing))
            if routing.local_direct is not None:
                dst = routing.local_direct[0]
                routing.direct = (dst, executors[dst], self.by_stage[dst])
        self.in_process_edges: dict[str, EdgeStats] = {}
        """In-process hop string -> its stats, for handoffs that start a new task (metrics on)."""
        if recorder is not None:
            for name, routing in self.by_stage.items():
                routing.stats = recorder.stage(name)
                for dst, in_process_hop in routing.local_tasks:
                    self.in_process_edges[in_process_hop] = recorder.edge(name, dst, IN_PROCESS)
                for dst, _ in routing.ends:
                    if dst in executors:
                        self.in_process_edges[hop(name, dst, IN_PROCESS)] = recorder.edge(name, dst, IN_PROCESS)
        self.plan: dict[str, tuple[Any, Routing]] = {
            name: (executors[name] if name in executors else NoExecutor(name), routing)
            for name, routing in self.by_stage.items()
        }
        """Stage -> (its executor, or a NoExecutor when this worker does not serve it; its Routing)."""

    def chains(self) -> dict[str, str]:
        """Stage -> the stage it calls directly, for every stage with a local `next` (Recorder.bind_chains)."""
        return {name: r.local_direct[0] for name, r in self.by_stage.items() if r.local_direct}

    def _direct_hops(self, routing: Routing) -> tuple[str, ...]:
        """The hops of the chain of direct calls that starts at a stage (the pipeline is acyclic)."""
        hops = []
        while routing.local_direct is not None:
            dst, in_process_hop = routing.local_direct
            hops.append(in_process_hop)
            routing = self.by_stage[dst]
        return tuple(hops)
