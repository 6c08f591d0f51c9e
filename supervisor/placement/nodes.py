"""Node assignment: a config's `processes: NAME: node:` pins applied to a Plan's groups. Pure."""

from __future__ import annotations

from dataclasses import replace

from stagevisor.supervisor.config import ConfigFile
from stagevisor.supervisor.errors import ConfigError, ErrorCode
from stagevisor.supervisor.plan import Plan, ProcessGroup


def apply_process_nodes(plan: Plan, config: ConfigFile) -> Plan:
    """The plan with each group's `processes: NAME: node:` from the config. Pure.

    A node names no group that exists: INVALID_CONFIG (the replicas of a group share its node). A TP
    stage's process name (`pipeline` for `pipeline_tp0`, `pipeline_tp1`) pins all its ranks.
    """
    nodes = {name: process.node for name, process in config.processes.items() if process.node}
    unknown = sorted(set(nodes) - {group.name for group in plan.groups} - {tp_base(g) for g in plan.groups})
    if unknown:
        raise ConfigError(
            ErrorCode.INVALID_CONFIG,
            f"processes: {', '.join(unknown)} set node: but the plan has no such process group "
            f"(groups: {', '.join(g.name for g in plan.groups)})",
            config_path=("processes", unknown[0], "node"),
        )
    if not nodes:
        return plan
    return replace(
        plan, groups=tuple(replace(g, node=nodes.get(g.name, nodes.get(tp_base(g), g.node))) for g in plan.groups)
    )


def tp_base(group: ProcessGroup) -> str:
    """The process name of a TP rank's stage (`pipeline` for `pipeline_tp1`); "" for any other group."""
    suffix = f"_tp{group.tp_rank}"
    return group.name[: -len(suffix)] if group.tp_size > 1 and group.name.endswith(suffix) else ""
