"""What a Plan asks of a Ray cluster (supervisor/cluster/resources.py), the Ray launcher's pure parts; no Ray here."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import pytest

from stagevisor.supervisor.cluster.resources import (
    ClusterNode,
    actor_resources,
    alive_nodes,
    check_cluster,
    cluster_lacks,
    TP_RANK_GPUS,
    TP_STRATEGY,
    gpu_share,
    plan_resources,
    tp_bundles,
    tp_placement_name,
    tp_stages,
)
from stagevisor.supervisor.config import ConfigFile
from stagevisor.supervisor.placement.nodes import apply_process_nodes
from stagevisor.supervisor.errors import ConfigError, ErrorCode, PlacementError
from stagevisor.supervisor.plan import GpuBudget, Plan, ProcessGroup
from stagevisor.supervisor.cluster.host import ray_device_env
from stagevisor.supervisor.cluster.launcher import actor_options, forwarded_env
from stagevisor.supervisor.worker.spec import WorkerSpec


def group(
    name: str, gpu: int | None = None, fraction: float | None = None, node: str | None = None, replicas: int = 1
) -> ProcessGroup:
    return ProcessGroup(
        name=name, stages=(name,), gpu=gpu, total_gpu_memory_fraction=fraction, node=node, replicas=replicas
    )


def plan(*groups: ProcessGroup, limit: float = 1.0) -> Plan:
    gpus = sorted({g.gpu for g in groups if g.gpu is not None})
    budgets = tuple(GpuBudget(gpu, 0.0, limit, tuple(g.name for g in groups if g.gpu == gpu)) for gpu in gpus)
    return Plan(model="m", model_path=None, changed=False, stages=(), groups=tuple(groups), edges=(), gpus=budgets)


def node(name: str, **resources: float) -> ClusterNode:
    return ClusterNode(name, "10.0.0.1", {"CPU": 1.0, **resources})


def test_a_cpu_group_asks_for_no_gpu_and_a_group_without_a_fraction_for_a_whole_one():
    assert gpu_share(group("g"), 0.9) == 0.0
    assert gpu_share(group("g", gpu=0), 0.9) == 1.0


def test_a_gpu_share_is_the_fraction_of_what_plan_lets_one_gpu_hold_rounded_up_to_rays_quantum():
    assert gpu_share(group("g", gpu=0, fraction=0.45), 0.9) == 0.5
    assert gpu_share(group("g", gpu=0, fraction=0.3), 0.9) == 0.3334  # never below the plan's share
    assert gpu_share(group("g", gpu=0, fraction=0.9), 0.9) == 1.0
    # Shares that plan accepted on one GPU (0.45 + 0.45 <= 0.9) fit one Ray GPU; a third would not.
    assert gpu_share(group("a", gpu=0, fraction=0.45), 0.9) * 2 <= 1.0


def test_a_node_pin_asks_for_a_sliver_of_its_resource():
    wanted = actor_resources(group("voc", node="tts-b"), 1.0)
    assert wanted.node == "tts-b" and 0 < wanted.resources["tts-b"] <= 0.001 and wanted.gpus == 0
    assert actor_resources(group("voc"), 1.0).resources == {}


def test_the_cluster_check_passes_when_every_group_has_a_node_and_gpus_that_fit():
    p = plan(group("engine", gpu=0, fraction=0.5, node="gpu-node"), group("voc", node="cpu-node"), group("any"))
    assert cluster_lacks(p, [node("a", **{"gpu-node": 1, "GPU": 1}), node("b", **{"cpu-node": 1})]) == []


def test_the_cluster_check_names_a_missing_node_resource_and_missing_gpus():
    p = plan(group("engine", gpu=0, fraction=0.5, node="gpu-node"), group("voc", node="tts-b"))
    missing = cluster_lacks(p, [node("a", **{"gpu-node": 1})])
    assert any("'tts-b'" in line and "'voc'" in line for line in missing), missing
    assert any("'engine'" in line and "0.5 GPU" in line for line in missing), missing
    with pytest.raises(PlacementError) as caught:
        check_cluster(p, [node("a", **{"gpu-node": 1})], "10.0.0.1:6379")
    assert caught.value.code is ErrorCode.CLUSTER_LACKS
    assert "10.0.0.1:6379" in caught.value.message and "'tts-b'" in caught.value.message


def test_the_cluster_check_adds_up_replicas_and_groups_pinned_to_one_node():
    p = plan(group("engine", gpu=0, node="gpu-node", replicas=2), group("other", gpu=1, node="gpu-node"))
    missing = cluster_lacks(p, [node("a", **{"gpu-node": 1, "GPU": 2})])
    assert any("need 3 GPUs" in line for line in missing), missing
    assert cluster_lacks(p, [node("a", **{"gpu-node": 1, "GPU": 3})]) == []


def test_an_empty_cluster_lacks_everything():
    assert cluster_lacks(plan(group("g")), []) == ["the cluster has no alive node"]


def test_only_alive_nodes_count():
    entries = [
        {"NodeID": "n1", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 1.0}},
        {"NodeID": "n2", "Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"tts-b": 1.0}},
    ]
    assert [n.node_id for n in alive_nodes(entries)] == ["n1"]


def test_config_nodes_land_on_their_groups_and_an_unknown_group_is_refused():
    p = plan(group("pipeline"), group("vocoder"))
    config = ConfigFile.model_validate({"processes": {"vocoder": {"node": "tts-b"}}})
    placed = apply_process_nodes(p, config)
    assert [g.node for g in placed.groups] == [None, "tts-b"]
    assert placed.groups[1].to_json()["node"] == "tts-b" and "node" not in placed.groups[0].to_json()
    assert plan_resources(placed)["vocoder"].node == "tts-b"
    with pytest.raises(ConfigError) as caught:
        apply_process_nodes(p, ConfigFile.model_validate({"processes": {"nope": {"node": "x"}}}))
    assert caught.value.code is ErrorCode.INVALID_CONFIG and "nope" in caught.value.message


def test_actor_options_never_detach_and_never_let_ray_restart():
    spec = WorkerSpec(
        group=group("engine", gpu=0, fraction=0.5, node="gpu-node"), stages=(), model_path=None, address="unix:/x"
    )
    options = actor_options(spec, actor_resources(spec.group, 1.0), "stagevisor-h-1-engine-1")
    assert options["max_restarts"] == 0 and "lifetime" not in options
    assert options["num_gpus"] == 0.5 and options["resources"] == {"gpu-node": 0.001}
    assert options["name"] == "stagevisor-h-1-engine-1" and options["namespace"] == "stagevisor"
    cpu = actor_options(replace(spec, group=group("voc")), actor_resources(group("voc"), 1.0), "n")
    assert "num_gpus" not in cpu and "resources" not in cpu


def test_replicas_spread_over_the_nodes_that_fit_and_a_single_worker_goes_where_ray_packs_it():
    spec = WorkerSpec(group=group("voc", replicas=2), stages=(), model_path=None, address="unix:/x", worker="voc/1")
    assert actor_options(spec, actor_resources(spec.group, 1.0), "n")["scheduling_strategy"] == "SPREAD"
    single = replace(spec, group=group("voc"), worker="")
    assert "scheduling_strategy" not in actor_options(single, actor_resources(single.group, 1.0), "n")


def test_a_gpu_worker_sees_the_gpu_ray_assigned_not_the_daemon_hosts_placement_gpu():
    spec = WorkerSpec(
        group=group("engine", gpu=3),
        stages=(),
        model_path=None,
        address="unix:/x",
        env={"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    )
    assert ray_device_env(spec, {"CUDA_VISIBLE_DEVICES": "1"}).env["CUDA_VISIBLE_DEVICES"] == "1"
    assert ray_device_env(spec, {}).env["CUDA_VISIBLE_DEVICES"] == "3"
    cpu = replace(spec, group=group("voc"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert ray_device_env(cpu, {"CUDA_VISIBLE_DEVICES": "1"}).env["CUDA_VISIBLE_DEVICES"] == ""


def test_workers_get_the_daemons_grpc_verbosity_pythonpath_and_stagevisor_variables_only():
    env = {
        "GRPC_VERBOSITY": "ERROR",
        "PYTHONPATH": "/app",
        "STAGEVISOR_CUDA_IPC": "0",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "x",
    }
    assert forwarded_env(env) == {"GRPC_VERBOSITY": "ERROR", "PYTHONPATH": "/app", "STAGEVISOR_CUDA_IPC": "0"}


def test_a_worker_may_run_on_any_node_that_fits_not_only_on_the_daemons_host():
    """The data plane crosses nodes (TCP): an actor asks only for its own node pin, and nodes of other hosts count."""
    wanted = actor_resources(group("voc", node="tts-b"), 1.0)
    assert wanted.resources == {"tts-b": 0.001}
    here, there = node("a"), ClusterNode("b", "10.0.0.2", {"CPU": 1.0, "tts-b": 1.0})
    assert cluster_lacks(plan(group("pipeline"), group("voc", node="tts-b")), [here, there]) == []
    assert cluster_lacks(plan(group("pipeline")), [there]) == []


def ranks(
    size: int = 2,
    fraction: float | None = 0.4,
    node: str | None = None,
    stage: str = "engine",
    gpus: Sequence[int] | None = None,
) -> list[ProcessGroup]:
    gpus = list(gpus) if gpus is not None else list(range(size))
    return [
        ProcessGroup(f"{stage}_tp{i}", (stage,), gpus[i], fraction, tp_rank=i, tp_size=size, node=node)
        for i in range(size)
    ]


def test_each_tp_rank_asks_a_whole_gpu_whatever_its_fraction_so_no_two_ranks_share_one():
    for fraction in (0.2, 0.4, 0.9, None):
        assert {gpu_share(g, 0.9) for g in ranks(fraction=fraction)} == {TP_RANK_GPUS} == {1.0}


def test_a_tp_stage_gets_one_bundle_per_rank_in_rank_order_with_its_node_sliver():
    shuffled = list(reversed(ranks(3, node="tts-a")))
    assert tp_bundles(shuffled, 0.9) == [{"GPU": 1.0, "tts-a": 0.001}] * 3
    assert tp_bundles(ranks(2), 1.0) == [{"GPU": 1.0}, {"GPU": 1.0}]
    assert TP_STRATEGY == "STRICT_PACK"
    assert tp_placement_name("vm-7", "engine") == "stagevisor-vm-7-engine-tp"
    with pytest.raises(ValueError):
        tp_bundles(ranks(3)[:2], 1.0)  # rank 2 missing


def test_tp_stages_groups_the_ranks_of_each_stage_in_rank_order():
    p = plan(group("voc", gpu=0, fraction=0.1), *reversed(ranks(2)), *ranks(2, stage="llm", gpus=[2, 3]))
    found = tp_stages(p)
    assert list(found) == ["engine", "llm"]
    assert [g.name for g in found["engine"]] == ["engine_tp0", "engine_tp1"]


def test_the_cluster_check_keeps_tp_ranks_on_one_node_with_a_whole_gpu_each():
    p = plan(*ranks(2, node="tts-a"))
    assert cluster_lacks(p, [node("a", GPU=2, **{"tts-a": 1})]) == []
    # Two GPUs in the cluster, but one per node: the ranks cannot stay together.
    missing = cluster_lacks(p, [node("a", GPU=1, **{"tts-a": 1}), node("b", GPU=1, **{"tts-a": 1})])
    assert any(
        "tensor-parallel stage 'engine' needs 2 whole GPUs on one node" in m and "'tts-a'" in m and "has 1" in m
        for m in missing
    ), missing
    # The node with two GPUs lacks the pinned resource.
    missing = cluster_lacks(p, [node("a", GPU=1, **{"tts-a": 1}), node("b", GPU=2)])
    assert any("needs 2 whole GPUs" in m for m in missing), missing
    # Unpinned: any node with two GPUs.
    assert cluster_lacks(plan(*ranks(2)), [node("a", GPU=1), node("b", GPU=2)]) == []
    # Whole GPUs: a 0.4 fraction per rank still needs two GPUs, and they count in the cluster's total.
    missing = cluster_lacks(plan(*ranks(2), group("voc", gpu=0, fraction=0.5)), [node("a", GPU=2)])
    assert any("needs 2.5 GPUs in all; the cluster has 2" in m for m in missing), missing


def test_a_tp_stage_s_process_name_in_the_config_pins_all_its_ranks():
    p = plan(*ranks(2, stage="pipeline"), group("voc"))
    placed = apply_process_nodes(p, ConfigFile.model_validate({"processes": {"pipeline": {"node": "tts-a"}}}))
    assert [g.node for g in placed.groups] == ["tts-a", "tts-a", None]
    one = apply_process_nodes(p, ConfigFile.model_validate({"processes": {"pipeline_tp1": {"node": "tts-b"}}}))
    assert [g.node for g in one.groups] == [None, "tts-b", None]
    with pytest.raises(ConfigError):
        apply_process_nodes(p, ConfigFile.model_validate({"processes": {"pipeline_tp": {"node": "x"}}}))


def test_ranks_of_one_tp_stage_pinned_to_different_nodes_are_refused():
    split = [replace(g, node=n) for g, n in zip(ranks(2), ["tts-a", "tts-b"], strict=True)]
    missing = cluster_lacks(plan(*split), [node("a", GPU=2, **{"tts-a": 1, "tts-b": 1})])
    assert any("pinned to different nodes (tts-a, tts-b)" in m for m in missing), missing


def test_a_lost_node_check_for_one_rank_still_asks_for_its_whole_stage():
    """The launcher checks one group at a time (a rank that cannot be placed): its stage's size counts."""
    [rank1] = ranks(2)[1:]
    missing = cluster_lacks(plan(rank1), [node("a", GPU=1)])
    assert any("needs 2 whole GPUs on one node" in m for m in missing), missing


def test_one_gpu_the_plan_needs_is_said_in_the_singular():
    """The line read `the plan needs 1 GPUs in all; the cluster has 0`."""
    missing = cluster_lacks(plan(group("engine", gpu=0)), [node("a")])
    assert "the plan needs 1 GPU in all; the cluster has 0" in missing, missing
