"""The placement options `plan`, `serve`, `check`, `bench` and `apply` share (the model, the YAML config,
--isolate-stage, --stage-process, --process-replicas, the launcher), and the plan they ask for.

Imports only the pure planner until a plan is made.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.placement.request import PlacementRequest


def add_placement_options(parser: argparse.ArgumentParser) -> None:
    """The options `plan` and `serve` share, so both validate a placement the same way."""
    group = add_model_options(parser)
    _add_assignment_options(group)


def add_launcher_options(parser: argparse.ArgumentParser) -> None:
    """--launcher and --ray-address, which `plan` and `serve` take (plan_from_args checks the cluster)."""
    group = parser.add_argument_group("launcher")
    group.add_argument(
        "--launcher",
        choices=("local", "ray"),
        default="local",
        help="local: worker processes on this host; ray: each worker under a Ray actor on the "
        "cluster of --ray-address (needs `stagevisor[ray]`); with `plan`, also checks that "
        "the cluster has the nodes and GPUs the plan needs (default %(default)s)",
    )
    group.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster for --launcher ray (e.g. 10.0.0.5:6379); default: RAY_ADDRESS, "
        "else the cluster `ray start` runs on this host",
    )


def add_model_options(parser: argparse.ArgumentParser) -> Any:
    """--model-path and --config (the model, without placement); returns the argument group."""
    group = parser.add_argument_group("placement")
    group.add_argument(
        "--model-path",
        metavar="MODEL",
        help="a registry key (see `stagevisor models`), an HF-style path such as fishaudio/s2-pro, "
        "or a local directory whose config.json names a known architecture; "
        "default: the embedded demo voice",
    )
    group.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML config: a built-in model with stage overrides merged by name, or a pipeline declared "
        "in full (see deploy/examples/)",
    )
    return group


def _add_assignment_options(group: Any) -> None:
    group.add_argument(
        "--isolate-stage",
        action="append",
        default=[],
        metavar="STAGE",
        help="run STAGE alone in a process group named STAGE (shorthand for --stage-process STAGE=STAGE); a stage "
        "the model already runs alone keeps its process group and name (a no-op); repeatable; a role alias such as "
        "`vocoder` works too",
    )
    group.add_argument(
        "--stage-process",
        action="append",
        default=[],
        metavar="STAGE=GROUP",
        help="place STAGE in process group GROUP; repeat with the same GROUP to put several stages in it",
    )
    group.add_argument(
        "--process-replicas",
        action="append",
        default=[],
        metavar="GROUP=N",
        help="run N worker processes for process group GROUP (data parallel; requests go to the least "
        "loaded); repeatable; overrides `processes: {GROUP: {replicas: N}}` in the YAML config",
    )


def request_from_args(args: argparse.Namespace) -> PlacementRequest:
    """The PlacementRequest of options parsed by add_placement_options."""
    from stagevisor.supervisor.placement.request import PlacementRequest

    return PlacementRequest(args.model_path, args.config, args.isolate_stage, args.stage_process, args.process_replicas)


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Validate the placement options parsed by add_placement_options; raises StagevisorError.

    With `--launcher ray` (add_launcher_options; a command without them sets `launcher` to "local") the cluster
    is joined and checked too (CLUSTER_LACKS), and this process stays joined: `serve` then runs its workers there.
    """
    from stagevisor.supervisor.placement.request import plan_placement

    plan = plan_placement(request_from_args(args))
    if args.launcher == "ray":
        from stagevisor.supervisor.cluster.connect import check_plan_on_cluster

        check_plan_on_cluster(plan, args.ray_address)
    return plan
