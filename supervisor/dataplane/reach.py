"""What a request entering a plan reaches: its stages, the terminal completions that end it, the groups per address.

Pure functions of the Plan; the gateway computes them once per topology.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from stagevisor.supervisor.plan import Plan


def reachable(plan: Plan, entry: str) -> list[str]:
    """The stages a request entering at `entry` can reach, `entry` first."""
    seen: list[str] = []
    stack = [entry]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.append(name)
        stage = plan.stage(name)
        stack.extend(stage.next)
    return seen


def count_paths(plan: Plan, entry: str) -> int:
    """Terminal completions one request produces: each path from the entry invokes its terminal once."""
    memo: dict[str, int] = {}

    def paths(name: str) -> int:
        if name not in memo:
            stage = plan.stage(name)
            memo[name] = 1 if not stage.next else sum(paths(n) for n in stage.next)
        return memo[name]

    return paths(entry)


def groups_by_address(plan: Plan, routes: Mapping[str, str], stages: Iterable[str]) -> dict[str, list[str]]:
    """Worker address ("" for a stage with no route) -> the process groups of `stages` served there, in order."""
    groups_at: dict[str, list[str]] = {}
    for stage in stages:
        group = plan.group_of(stage).name
        names = groups_at.setdefault(routes.get(stage, ""), [])
        if group not in names:
            names.append(group)
    return groups_at
