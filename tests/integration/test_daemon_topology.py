"""A running daemon's process tree, topology, health and reflection match the plan it was given.

Each plan runs in one daemon shared by the read-only tests of this module.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.integration.daemon_helpers import (
    DaemonProcess,
    colocated_pipeline,
    higgs_isolated_audio_encoder,
    ming_isolated_audio_decode,
    worker_pids,
)

PLANS = {
    "higgs-isolate-audio_encoder": higgs_isolated_audio_encoder,
    "qwen3-colocated-pipeline": colocated_pipeline,
    "ming-isolate-audio_decode": ming_isolated_audio_decode,
}
RUNTIME_GROUP_FIELDS = ("pid", "state", "restarts", "started_at", "fraction_enforced", "resources")
RUNTIME_GPU_FIELDS = ("total_bytes", "measured_bytes", "over_limit")
RUNTIME_EDGE_FIELDS = ("transport", "src_group", "dst_group", "requests")


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
    stripped = dict(topology)
    stripped["groups"] = [{k: v for k, v in g.items() if k not in RUNTIME_GROUP_FIELDS} for g in topology["groups"]]
    stripped["edges"] = [{k: v for k, v in e.items() if k not in RUNTIME_EDGE_FIELDS} for e in topology["edges"]]
    stripped["gpus"] = [{k: v for k, v in b.items() if k not in RUNTIME_GPU_FIELDS} for b in topology["gpus"]]
    assert stripped == plan.to_json()


def test_every_group_is_ready_with_a_start_time_and_no_restarts(running):
    _, _, topology = running
    assert [(g["state"], g["restarts"]) for g in topology["groups"]] == [("READY", 0)] * len(topology["groups"])
    assert all(g["started_at"] for g in topology["groups"])


def test_fractions_are_reported_as_not_enforced_without_cuda(running):
    plan, _, topology = running
    assert [g["total_gpu_memory_fraction"] for g in topology["groups"]] == [
        g.total_gpu_memory_fraction for g in plan.groups]
    assert not any(g["fraction_enforced"] for g in topology["groups"])


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
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=10)
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
