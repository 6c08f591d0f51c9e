"""What changes between two Plans of one model: groups added, removed, merged, split or changed, and the GPU budget
both need while a running daemon switches from one to the other. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.gpu_accounting import TOLERANCE, stages_on_gpu
from stagevisor.supervisor.placement.wording import fraction_text, listed_text
from stagevisor.supervisor.plan import Plan, ProcessGroup

ChangeKind = Literal["added", "removed", "changed", "kept"]


@dataclass(frozen=True)
class GroupChange:
    """One process group, before and after: `kept` when nothing about it changes."""

    kind: ChangeKind
    name: str
    details: tuple[str, ...] = ()
    """What changed, one phrase each (`stages preprocessing, tts_engine -> tts_engine`, `replicas 1 -> 2`)."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "details": list(self.details)}


@dataclass(frozen=True)
class TopologyDiff:
    """Every group of either plan, plus the stages that move and the groups merged or split on the way."""

    groups: tuple[GroupChange, ...]
    moved: tuple[tuple[str, str, str], ...]
    """(stage, its group before, its group after) for each stage whose group changes."""
    merged: tuple[tuple[str, tuple[str, ...]], ...]
    """(a group after, the groups before whose stages it holds) where there were several."""
    split: tuple[tuple[str, tuple[str, ...]], ...]
    """(a group before, the groups after its stages went to) where there are several."""

    @property
    def changed(self) -> bool:
        return any(g.kind != "kept" for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "groups": [g.to_json() for g in self.groups],
            "moved": [{"stage": s, "from": a, "to": b} for s, a, b in self.moved],
            "merged": [{"group": g, "from": list(sources)} for g, sources in self.merged],
            "split": [{"group": g, "into": list(targets)} for g, targets in self.split],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TopologyDiff":
        """The inverse of to_json (the CLI reads the daemon's answer back)."""
        return cls(
            tuple(GroupChange(g["kind"], g["name"], tuple(g["details"])) for g in data["groups"]),
            tuple((m["stage"], m["from"], m["to"]) for m in data["moved"]),
            tuple((m["group"], tuple(m["from"])) for m in data["merged"]),
            tuple((s["group"], tuple(s["into"])) for s in data["split"]),
        )

    def render(self) -> str:
        """One line per group that changes (`+` added, `-` removed, `~` changed), then merges and splits."""
        if not self.changed:
            return "no change: the running topology already is this plan"
        marks = {"added": "+", "removed": "-", "changed": "~"}
        lines = [
            f"{marks[g.kind]} {g.name}" + (f": {'; '.join(g.details)}" if g.details else "")
            for g in self.groups
            if g.kind != "kept"
        ]
        lines += [f"  merged into {group}: {', '.join(sources)}" for group, sources in self.merged]
        lines += [f"  split {group} into: {', '.join(targets)}" for group, targets in self.split]
        kept = [g.name for g in self.groups if g.kind == "kept"]
        if kept:
            lines.append(f"  unchanged: {', '.join(kept)} (restarted with the rest: every worker is replaced)")
        return "\n".join(lines)


def _stage_groups(plan: Plan) -> dict[str, str]:
    return {stage: group.name for group in plan.groups if group.tp_rank in (None, 0) for stage in group.stages}


def _fraction(value: float | None) -> str:
    return "none" if value is None else fraction_text(value)


def _group_details(before: ProcessGroup, after: ProcessGroup) -> tuple[str, ...]:
    details = []
    if before.stages != after.stages:
        details.append(f"stages {', '.join(before.stages)} -> {', '.join(after.stages)}")
    if before.gpu != after.gpu:
        details.append(f"gpu {before.gpu} -> {after.gpu}")
    if before.total_gpu_memory_fraction != after.total_gpu_memory_fraction:
        details.append(
            f"fraction {_fraction(before.total_gpu_memory_fraction)} -> {_fraction(after.total_gpu_memory_fraction)}"
        )
    if before.replicas != after.replicas:
        details.append(f"replicas {before.replicas} -> {after.replicas}")
    if before.autoscale != after.autoscale:
        details.append("autoscale settings")
    return tuple(details)


def _stage_details(before: Plan, after: Plan, stages: tuple[str, ...]) -> tuple[str, ...]:
    """What changes in the stages themselves (their executor's factory or arguments), wherever they run."""
    details = []
    old = {s.name: s for s in before.stages}
    for name in stages:
        if name not in old:
            continue
        was, now = old[name], after.stage(name)
        if was.factory != now.factory:
            details.append(f"stage {name} factory {was.factory} -> {now.factory}")
        if dict(was.args) != dict(now.args):
            details.append(f"stage {name} args")
    return tuple(details)


def topology_diff(before: Plan, after: Plan) -> TopologyDiff:
    """The groups of `before` and `after` (after's order, then the removed ones), and how stages move."""
    old = {g.name: g for g in before.groups}
    new = {g.name: g for g in after.groups}
    groups = []
    for name, group in new.items():
        if name not in old:
            groups.append(GroupChange("added", name, (f"stages {', '.join(group.stages)}",)))
        else:
            details = _group_details(old[name], group) + _stage_details(before, after, group.stages)
            groups.append(GroupChange("changed" if details else "kept", name, details))
    groups += [
        GroupChange("removed", name, (f"stages {', '.join(g.stages)}",)) for name, g in old.items() if name not in new
    ]
    was, now = _stage_groups(before), _stage_groups(after)
    moved = tuple((stage, was[stage], now[stage]) for stage in now if stage in was and was[stage] != now[stage])
    sources: dict[str, list[str]] = {}
    targets: dict[str, list[str]] = {}
    for stage, group_name in now.items():
        if stage in was:
            sources.setdefault(group_name, [])
            if was[stage] not in sources[group_name]:
                sources[group_name].append(was[stage])
            targets.setdefault(was[stage], [])
            if group_name not in targets[was[stage]]:
                targets[was[stage]].append(group_name)
    merged = tuple((g, tuple(s)) for g, s in sources.items() if len(s) > 1)
    split = tuple((g, tuple(t)) for g, t in targets.items() if len(t) > 1)
    return TopologyDiff(tuple(groups), moved, merged, split)


def check_switch_budget(before: Plan, after: Plan) -> None:
    """While a daemon switches, both plans' workers run: each GPU must hold both. MISSING_FRACTION when a GPU both
    use has a stage (running or new) that declares no fraction, since whether both fit is then unknown; OVER_LIMIT
    when their total passes the GPU's limit."""
    running = {b.id: b for b in before.gpus}
    for budget in after.gpus:
        current = running.get(budget.id)
        if current is None:
            continue
        _check_switch_fractions(before, after, budget.id)
        # A GPU where nothing declares a fraction adds none to the other plan's (None: undeclared).
        running_now, new = current.total_gpu_memory_fraction or 0.0, budget.total_gpu_memory_fraction or 0.0
        total = running_now + new
        if total > budget.limit + TOLERANCE:
            raise PlacementError(
                ErrorCode.OVER_LIMIT,
                f"GPU {budget.id} would carry total_gpu_memory_fraction {fraction_text(total)} while the daemon "
                f"switches ({fraction_text(running_now)} running now + "
                f"{fraction_text(new)} for the new topology), over its limit "
                f"{fraction_text(budget.limit)}; both topologies run until the new one is READY. Lower the "
                "fractions, scale groups down first, or restart the daemon with the new plan",
                gpu=budget.id,
            )


def _check_switch_fractions(before: Plan, after: Plan, gpu: int) -> None:
    """MISSING_FRACTION for the stages on `gpu`, running or new, that declare no fraction: both topologies share it
    during the switch, and a process alone on a GPU needs no fraction (it may be using all of it)."""
    missing = {which: _undeclared_on_gpu(plan, gpu) for which, plan in (("running", before), ("new", after))}
    if not any(missing.values()):
        return
    named = "; ".join(f"{which}: {listed_text(names)}" for which, names in missing.items() if names)
    raise PlacementError(
        ErrorCode.MISSING_FRACTION,
        f"both topologies run on GPU {gpu} until the new one is READY, and stages on it declare no "
        f"total_gpu_memory_fraction ({named}), so whether both fit is unknown: a process alone on a GPU may use all "
        "of it. Restart the daemon with the new plan, or with every GPU stage's fraction declared under `stages:` in "
        "a YAML config (--config) for later applies",
        stages=tuple(dict.fromkeys(name for names in missing.values() for name in names)),
        gpu=gpu,
    )


def _undeclared_on_gpu(plan: Plan, gpu: int) -> tuple[str, ...]:
    fractions = {s.name: s.total_gpu_memory_fraction for s in plan.stages if s.gpu is not None}
    return tuple(name for name, fraction, _ in stages_on_gpu(fractions, plan.groups, gpu) if fraction is None)


def check_restart_surge(plan: Plan, group: str) -> None:
    """A restart without a pause runs a second copy of `group`'s worker beside it until the old one stops: its
    GPU must hold both. MISSING_FRACTION when a stage of the group declares no fraction (how much the copy needs
    is unknown), OVER_LIMIT when the GPU would pass its limit; a CPU group always fits."""
    current = plan.group(group)
    if current.gpu is None:
        return
    force = f"`stagevisor restart {group} --force` stops the worker first (its requests in flight fail)"
    missing = tuple(
        s.name
        for s in plan.stages
        if s.name in current.stages and s.gpu is not None and s.total_gpu_memory_fraction is None
    )
    if missing or current.total_gpu_memory_fraction is None:
        raise PlacementError(
            ErrorCode.MISSING_FRACTION,
            f"restarting group {group!r} without a pause starts a second worker beside it on GPU {current.gpu}, "
            f"and its stages {', '.join(map(repr, missing or current.stages))} declare no total_gpu_memory_fraction, "
            f"so whether both fit is unknown; declare the fractions, or {force}",
            stages=missing or current.stages,
            gpu=current.gpu,
        )
    budget = next(b for b in plan.gpus if b.id == current.gpu)
    running_now = budget.total_gpu_memory_fraction or 0.0  # never None here: the group declares its fractions
    total = running_now + current.total_gpu_memory_fraction
    if total > budget.limit + TOLERANCE:
        raise PlacementError(
            ErrorCode.OVER_LIMIT,
            f"restarting group {group!r} without a pause starts a second worker beside it: GPU {current.gpu} "
            f"would carry total_gpu_memory_fraction {fraction_text(total)} "
            f"({fraction_text(running_now)} running now + "
            f"{fraction_text(current.total_gpu_memory_fraction)} for the new worker), over its limit "
            f"{fraction_text(budget.limit)}; {force}",
            gpu=current.gpu,
        )
