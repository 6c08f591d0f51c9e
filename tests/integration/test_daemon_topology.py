"""A running daemon's process tree, topology, health and reflection match the plan it was given.

Each plan runs in one daemon shared by the read-only tests of this module.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from stagevisor.supervisor.worker.spec import physical_gpu
from tests.integration.daemon_helpers import (
    DaemonProcess,
    colocated_pipeline,
    higgs_isolated_audio_encoder,
    ming_isolated_audio_decode,
    plan_part,
    worker_pids,
)

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

PLANS = {
    "higgs-isolate-audio_encoder": higgs_isolated_audio_encoder,
    "colocated-pipeline": colocated_pipeline,
    "ming-isolate-audio_decode": ming_isolated_audio_decode,
}


@pytest.fixture(scope="module", params=list(PLANS))
def running(request):
    plan = PLANS[request.param]()
    with DaemonProcess(plan) as daemon:
        daemon.wait_serving()
        yield plan, daemon, daemon.topology()


def test_exactly_one_worker_process_per_group(running):
    plan, daemon, topology = running
    workers = worker_pids(daemon.pid)
    assert len(workers) == len(plan.groups)
    assert sorted(workers) == sorted(group["pid"] for group in topology["groups"])


def test_topology_json_is_the_plan_json_plus_runtime_fields(running):
    plan, _, topology = running
    assert plan_part(topology) == plan.to_json()


def test_every_group_is_ready_with_a_start_time_and_no_restarts(running):
    _, _, topology = running
    assert [(g["state"], g["restarts"]) for g in topology["groups"]] == [("READY", 0)] * len(topology["groups"])
    assert all(g["started_at"] for g in topology["groups"])


def test_fractions_are_reported_as_not_enforced_without_cuda(running):
    plan, _, topology = running
    assert [g["total_gpu_memory_fraction"] for g in topology["groups"]] == [
        g.total_gpu_memory_fraction for g in plan.groups
    ]
    assert not any(g["fraction_enforced"] for g in topology["groups"])


def environ_of(pid: int) -> dict[str, str]:
    """The environment a process was started with (what an operator sees in /proc/PID/environ)."""
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def test_each_worker_starts_seeing_only_its_groups_gpu_and_cpu_groups_none(running):
    _, daemon, topology = running
    for group in topology["groups"]:
        env = environ_of(group["pid"])
        expected = "" if group["gpu"] is None else physical_gpu(group["gpu"], daemon.env)
        assert env["CUDA_VISIBLE_DEVICES"] == expected, group["name"]
        assert env["CUDA_DEVICE_ORDER"] == daemon.env.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def test_topology_reports_each_gpu_groups_physical_device_and_where_it_runs(running):
    _, daemon, topology = running
    for group in topology["groups"]:
        if group["gpu"] is None:
            assert (group["physical_gpu"], group["device"]) == (None, ""), group["name"]
        else:
            assert group["physical_gpu"] == physical_gpu(group["gpu"], daemon.env), group["name"]
            assert group["device"] == "cpu" or group["device"].startswith("cuda:0"), group["name"]


def test_placement_gpu_ids_count_the_devices_the_daemon_was_given():
    """Under CUDA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb, GPU 0 is GPU-aaa: its worker sees that one device only."""
    with DaemonProcess(colocated_pipeline(), env={"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}) as daemon:
        daemon.wait_serving()
        (group,) = daemon.topology()["groups"]
        assert environ_of(group["pid"])["CUDA_VISIBLE_DEVICES"] == "GPU-aaa"
        assert group["physical_gpu"] == "GPU-aaa" and group["device"] == "cpu"  # no such device here
        assert "gpu 0 (physical GPU-aaa, on cpu)" in daemon.cli("topology").stdout


def test_edges_report_grpc_across_processes_and_in_process_inside_one(running):
    plan, _, topology = running
    for edge in topology["edges"]:
        src, dst = plan.group_of(edge["src"]).name, plan.group_of(edge["dst"]).name
        assert (edge["src_group"], edge["dst_group"]) == (src, dst)
        assert edge["transport"] == ("grpc" if src != dst else "in_process")


def test_health_is_serving_on_admin_and_public_endpoints(running):
    _, daemon, _ = running
    for address in (daemon.admin_address, daemon.listen):
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "stagevisor.v1.Synthesis"):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_admin_service(running):
    _, daemon, _ = running
    with grpc.insecure_channel(daemon.admin_address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
        names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert {"stagevisor.v1.Admin", "grpc.health.v1.Health"} <= names


def test_topology_table_lists_groups_with_pids_and_edges_with_transport(running):
    _, daemon, topology = running
    result = daemon.cli("topology")
    assert result.returncode == 0, result.stderr
    for group in topology["groups"]:
        assert f"pid {group['pid']}" in result.stdout
        assert f"{group['name']:<{max(len(g['name']) for g in topology['groups'])}} : " in result.stdout
    assert "edges:" in result.stdout
