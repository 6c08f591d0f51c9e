"""What a Plan asks of a Ray cluster, pure: each worker's actor resources and the check that the cluster has them.

No Ray import here: `stagevisor plan` and the unit tests use it without the
`ray` extra. `supervisor/cluster/launcher.py` applies it.

A process group's `node:` (config `processes: {NAME: {node: X}}`) names a Ray
resource: a custom resource the operator gave the node (`ray start
--resources '{"tts-a": 1}'`) or Ray's built-in `node:<ip>`. The worker asks for
a sliver of it (`NODE_SLIVER`), so every worker pinned to that node fits.
A GPU group asks for the share of one GPU its memory fraction takes of what
`plan` lets one GPU hold: fraction / max_total_gpu_memory_fraction_per_gpu,
so Ray never packs more onto a GPU than `plan` accepted.

A tensor-parallel stage's ranks go in one STRICT_PACK placement group, a
bundle per rank with a whole GPU (TP_RANK_GPUS), so they share a node and
never a GPU (supervisor/cluster/tp.py applies it).

Any alive node that fits may run a worker: workers on the daemon's node use
unix sockets and its shared memory, the others TCP (supervisor/dataplane/peers.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.numbers import counted
from stagevisor.supervisor.plan import Plan, ProcessGroup

NODE_SLIVER = 0.001
"""How much of a `node:` resource each worker asks for: a node with 1 unit holds 1000 pinned workers."""
RESOURCE_QUANTUM = 10_000
"""Ray counts fractional resources in steps of 1/10,000."""
TP_RANK_GPUS = 1.0
"""The GPU share of each tensor-parallel rank: a whole GPU. Ray hands out fractional GPUs by packing them onto
one device, so two ranks asking 0.45 each could share a GPU; a whole GPU each keeps every rank on its own."""
TP_STRATEGY = "STRICT_PACK"
"""The ranks of one TP stage go in one Ray placement group with one bundle per rank, all on one node."""


@dataclass(frozen=True)
class ActorResources:
    """What one worker's Ray actor asks the scheduler for."""

    gpus: float = 0.0
    node: str | None = None
    """The Ray resource that pins it (a `node:` of the config), None: any node."""
    resources: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        parts = []
        if self.gpus:
            parts.append(f"{self.gpus:g} GPU")
        if self.node:
            parts.append(f"node resource {self.node!r}")
        return " on ".join(parts) if parts else "any node"


def gpu_share(group: ProcessGroup, per_gpu_limit: float) -> float:
    """The part of one GPU a group's worker asks Ray for; 0 for a CPU group. Pure.

    A group without a declared fraction takes a whole GPU (plan lets such a
    group be alone on its GPU only), and so does a tensor-parallel rank
    (TP_RANK_GPUS). Rounded up to Ray's resource quantum.
    """
    if group.gpu is None:
        return 0.0
    if group.tp_size > 1:
        return TP_RANK_GPUS
    fraction = group.total_gpu_memory_fraction
    if fraction is None:
        return 1.0
    share = min(1.0, fraction / per_gpu_limit) if per_gpu_limit > 0 else 1.0
    return math.ceil(share * RESOURCE_QUANTUM - 1e-6) / RESOURCE_QUANTUM


def actor_resources(group: ProcessGroup, per_gpu_limit: float) -> ActorResources:
    """What the worker of `group` asks Ray for."""
    resources: dict[str, float] = {}
    node = group.node
    if node:
        resources[node] = NODE_SLIVER
    return ActorResources(gpus=gpu_share(group, per_gpu_limit), node=node, resources=resources)


def tp_stages(plan: Plan) -> dict[str, tuple[ProcessGroup, ...]]:
    """Each tensor-parallel stage's rank groups, in rank order (its first stage names it). Pure."""
    ranks: dict[str, list[ProcessGroup]] = {}
    for group in plan.groups:
        if group.tp_size > 1:
            ranks.setdefault(group.stages[0], []).append(group)
    return {stage: tuple(sorted(groups, key=lambda g: g.tp_rank or 0)) for stage, groups in ranks.items()}


def tp_bundle(group: ProcessGroup, per_gpu_limit: float) -> dict[str, float]:
    """The placement-group bundle of one TP rank: what its actor asks for (its GPU, its node's sliver)."""
    need = actor_resources(group, per_gpu_limit)
    bundle = dict(need.resources)
    if need.gpus:
        bundle["GPU"] = need.gpus
    return bundle or {"CPU": NODE_SLIVER}  # Ray refuses an empty bundle


def tp_bundles(ranks: Sequence[ProcessGroup], per_gpu_limit: float) -> list[dict[str, float]]:
    """One bundle per rank, bundle i for rank i, of a STRICT_PACK placement group (TP_STRATEGY). Pure."""
    ordered = sorted(ranks, key=lambda g: g.tp_rank or 0)
    if [g.tp_rank for g in ordered] != list(range(len(ordered))) or any(g.tp_size != len(ordered) for g in ordered):
        raise ValueError(f"TP ranks {[g.name for g in ranks]} are not ranks 0..tp_size-1 of one stage")
    return [tp_bundle(g, per_gpu_limit) for g in ordered]


def tp_placement_name(daemon: str, stage: str) -> str:
    """The name of a TP stage's placement group: `stagevisor-<daemon id>-<stage>-tp` (`ray list placement-groups`)."""
    return f"stagevisor-{daemon}-{stage}-tp"


def _tp_lacks(plan: Plan, nodes: Sequence[ClusterNode]) -> list[str]:
    """What the nodes lack to keep each TP stage's ranks together: one node with a whole GPU per rank."""
    missing = []
    for stage, ranks in tp_stages(plan).items():
        size = ranks[0].tp_size
        pins = sorted({g.node for g in ranks if g.node})
        if len(pins) > 1:
            missing.append(
                f"the ranks of tensor-parallel stage {stage!r} are pinned to different nodes "
                f"({', '.join(pins)}); they must share one node"
            )
            continue
        pin = pins[0] if pins else None
        fits = [n for n in nodes if pin is None or n.resources.get(pin, 0.0) > 0]
        gpus = size * TP_RANK_GPUS if ranks[0].gpu is not None else 0.0
        if fits and any(n.resources.get("GPU", 0.0) >= gpus - 1e-9 for n in fits):
            continue
        where = f"with the Ray resource {pin!r}" if pin else "alive"
        largest = max((n.resources.get("GPU", 0.0) for n in fits), default=0.0)
        missing.append(
            f"tensor-parallel stage {stage!r} needs {gpus:g} whole GPUs on one node (its {size} ranks "
            f"stay together, one GPU each); the largest node {where} has {largest:g}"
        )
    return missing


def per_gpu_limit(plan: Plan) -> float:
    """The plan's max_total_gpu_memory_fraction_per_gpu (every GpuBudget carries the same); 1 without GPUs."""
    return next((budget.limit for budget in plan.gpus), 1.0)


def plan_resources(plan: Plan) -> dict[str, ActorResources]:
    """Each process group's actor resources, in plan order (every replica of a group asks the same)."""
    limit = per_gpu_limit(plan)
    return {group.name: actor_resources(group, limit) for group in plan.groups}


@dataclass(frozen=True)
class ClusterNode:
    """One alive node of the cluster as `ray.nodes()` reports it: its id, address and total resources."""

    node_id: str
    address: str
    resources: Mapping[str, float]

    @classmethod
    def from_ray(cls, entry: Mapping[str, Any]) -> "ClusterNode":
        return cls(
            str(entry.get("NodeID", "")), str(entry.get("NodeManagerAddress", "")), dict(entry.get("Resources") or {})
        )


def alive_nodes(entries: Iterable[Mapping[str, Any]]) -> list[ClusterNode]:
    return [ClusterNode.from_ray(entry) for entry in entries if entry.get("Alive")]


def cluster_lacks(plan: Plan, nodes: Sequence[ClusterNode]) -> list[str]:
    """What the cluster lacks to run the plan, in words; empty when it has it. Pure.

    Checks that each group has a node with its `node:` resource and a GPU
    share to spare, and that the GPU shares asked of each `node:` (and of the
    cluster as a whole) fit in the GPUs there. It does not solve the packing:
    Ray's scheduler does, and a worker it cannot place fails to start with
    the reason.
    """
    missing: list[str] = []
    if not nodes:
        return ["the cluster has no alive node"]
    wanted = plan_resources(plan)
    demand: dict[str | None, float] = {}
    missing.extend(_tp_lacks(plan, nodes))
    for group in plan.groups:
        need = wanted[group.name]
        replicas = max(1, group.replicas)
        demand[need.node] = demand.get(need.node, 0.0) + need.gpus * replicas
        candidates = [n for n in nodes if need.node is None or n.resources.get(need.node, 0.0) > 0]
        if not candidates:
            missing.append(
                f"group {group.name!r} names node {need.node!r}, but no alive node has the Ray resource {need.node!r}"
            )
            continue
        if need.gpus and not any(n.resources.get("GPU", 0.0) >= need.gpus for n in candidates):
            where = f"node {need.node!r}" if need.node else "any node"
            missing.append(f"group {group.name!r} needs {need.gpus:g} GPU on {where}, which has none that large")
    for node, gpus in demand.items():
        if node is None or gpus == 0:
            continue
        have = sum(n.resources.get("GPU", 0.0) for n in nodes if n.resources.get(node, 0.0) > 0)
        if have and gpus > have + 1e-9:
            missing.append(f"the groups pinned to node {node!r} need {counted(gpus, 'GPU')}; its nodes have {have:g}")
    total = sum(demand.values())
    have = sum(n.resources.get("GPU", 0.0) for n in nodes)
    if total > have + 1e-9:
        missing.append(f"the plan needs {counted(total, 'GPU')} in all; the cluster has {have:g}")
    return missing


def check_cluster(plan: Plan, nodes: Sequence[ClusterNode], address: str = "") -> None:
    """Raise CLUSTER_LACKS naming everything the cluster lacks for the plan."""
    missing = cluster_lacks(plan, nodes)
    if missing:
        where = f" at {address}" if address else ""
        raise PlacementError(
            ErrorCode.CLUSTER_LACKS,
            f"the Ray cluster{where} cannot run this plan: {'; '.join(missing)}. Add the nodes or GPUs "
            "(`ray start --resources`, `--num-gpus`), or change `processes: NAME: node:` in the config",
        )
