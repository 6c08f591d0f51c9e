"""Per-worker device isolation: each GPU group's worker sees only its own GPU, as CUDA device 0."""

from __future__ import annotations

import asyncio
import os
import types
from pathlib import Path

import pytest

from stagevisor.supervisor.daemon.specs import worker_specs
from stagevisor.supervisor.daemon.launcher import child_environment
from stagevisor.supervisor.plan import Plan, PlannedStage, ProcessGroup
from stagevisor.supervisor.worker.build import build_stages
from stagevisor.supervisor.worker.gpu import bind_gpu
from stagevisor.supervisor.worker.spec import WorkerSpec, device_environment, physical_gpu

ECHO = "tests.integration.daemon_stages:make_echo"


def plan() -> Plan:
    stages = (
        PlannedStage("pre", "front", None, 1, None, None, ECHO),
        PlannedStage("engine", "engine", 1, 1, 0.8, "declared", ECHO, next=("voc",)),
        PlannedStage("voc", "voc", 1, 1, 0.1, "declared", ECHO),
    )
    groups = (
        ProcessGroup("front", ("pre",), None, None),
        ProcessGroup("engine", ("engine",), 1, 0.8),
        ProcessGroup("voc", ("voc",), 1, 0.1),
    )
    return Plan("m", "org/m", False, stages, groups, (), ())


@pytest.mark.parametrize(
    "environ, gpu, expected",
    [
        ({}, 1, "1"),
        ({"CUDA_VISIBLE_DEVICES": "3,5"}, 1, "5"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, 0, "GPU-aa"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 1, None),
    ],
)
def test_the_physical_gpu_counts_the_devices_the_daemon_sees(environ, gpu, expected):
    assert physical_gpu(gpu, environ) == expected


def test_a_gpu_group_sees_only_its_device_in_pci_bus_order():
    assert device_environment((1,), {"CUDA_VISIBLE_DEVICES": "2,6"}) == {
        "CUDA_VISIBLE_DEVICES": "6",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def test_an_order_the_daemon_chose_is_kept():
    assert device_environment((0,), {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_a_cpu_group_and_a_gpu_the_daemon_cannot_see_get_no_device():
    assert device_environment((), {})["CUDA_VISIBLE_DEVICES"] == ""
    assert device_environment((4,), {"CUDA_VISIBLE_DEVICES": "0"})["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize("off", ["0", "false", "off"])
def test_isolation_can_be_switched_off(off):
    assert device_environment((1,), {"STAGEVISOR_GPU_ISOLATION": off}) == {}


def tp_plan() -> Plan:
    stages = (PlannedStage("engine", "engine", (2, 3), 2, 0.8, "declared", ECHO),)
    groups = (
        ProcessGroup("engine_tp0", ("engine",), 2, 0.8, tp_rank=0, tp_size=2),
        ProcessGroup("engine_tp1", ("engine",), 3, 0.8, tp_rank=1, tp_size=2),
    )
    return Plan("m", "org/m", False, stages, groups, (), ())


def test_a_tp_rank_sees_its_stages_gpus_in_rank_order_and_binds_its_own():
    """Peer-to-peer between ranks (NCCL, custom all-reduce) needs the other ranks' devices visible."""
    specs, _ = worker_specs(tp_plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO", environ={})
    assert [specs[g].env["CUDA_VISIBLE_DEVICES"] for g in ("engine_tp0", "engine_tp1")] == ["2,3", "2,3"]
    assert [specs[g].local_gpu for g in ("engine_tp0", "engine_tp1")] == [0, 1]
    calls = []
    bind_gpu(specs["engine_tp1"], import_module=lambda name: fake_torch(calls, count=2))
    assert calls[0] == ("set_device", 1)


def test_worker_specs_carry_each_groups_device_environment_and_the_peers_gpus():
    specs, sink = worker_specs(
        plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO", environ={"CUDA_VISIBLE_DEVICES": "4,7"}
    )
    assert specs["front"].env["CUDA_VISIBLE_DEVICES"] == ""
    assert specs["engine"].env["CUDA_VISIBLE_DEVICES"] == "7" and specs["engine"].isolated
    gpus = specs["engine"].address_gpus
    assert gpus[specs["voc"].address] == 1 and gpus[specs["front"].address] is None and sink not in gpus


def test_the_spawn_environment_is_restored_after_the_start(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with child_environment({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and "CUDA_DEVICE_ORDER" not in os.environ


def isolated_spec(group: str = "engine") -> WorkerSpec:
    specs, _ = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO", environ={})
    return specs[group]


def fake_torch(calls: list, count: int = 1):
    props = types.SimpleNamespace(name="Fake GPU", uuid="1234")
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: count,
        set_device=lambda gpu: calls.append(("set_device", gpu)),
        set_per_process_memory_fraction=lambda f, gpu: calls.append(("fraction", f, gpu)),
        get_device_properties=lambda gpu: props,
    )
    return types.SimpleNamespace(cuda=cuda)


def test_an_isolated_worker_binds_cuda_device_0_whatever_its_placement_gpu():
    calls = []
    binding = bind_gpu(isolated_spec(), import_module=lambda name: fake_torch(calls))
    assert calls == [("set_device", 0), ("fraction", 0.8, 0)]
    assert binding.gpu == 0 and binding.fraction_enforced and binding.device == "cuda:0 (Fake GPU, GPU-1234)"


def test_without_cuda_an_isolated_worker_says_which_device_it_was_given(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    binding = bind_gpu(isolated_spec(), import_module=lambda name: fake_torch([], count=0))
    assert binding.device == "cpu" and not binding.fraction_enforced
    assert binding.warning.startswith("no CUDA device 1 (CUDA_VISIBLE_DEVICES='1'): GPU stages of group 'engine'")


def test_stages_of_an_isolated_worker_get_gpu_id_0_and_cpu_stages_none():
    built = asyncio.run(build_stages(isolated_spec()))
    assert built["engine"].injected["gpu_id"] == 0
    assert asyncio.run(build_stages(isolated_spec("front")))["pre"].injected["gpu_id"] is None
