"""The daemon's reports: each round-trips proto <-> typed <-> JSON, defaults and empty values included."""

from __future__ import annotations

import json

import pytest

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.plan import Autoscale
from stagevisor.supervisor.reports import (
    EdgeReport,
    GpuReport,
    GroupReport,
    GroupResources,
    GroupStatus,
    GroupSummary,
    ReplicaReport,
    RootCause,
    StageReport,
    StageSummary,
    StatusReport,
    SummaryReport,
    TopologyReport,
)

MEASURED = GroupResources(300 << 20, 2.5, 50.0, 9, 21, 0, 256 << 20, "rss", True)
"""GPU memory measured as 0 bytes: present, not None."""
UNMEASURED = GroupResources(0, 0.0, 0.0, 0, 0)
BOUNDS = Autoscale(1, 3, 0.5, None, 4.0, 0.5, 5.0, 30.0, 10.0)

SINGLE = GroupReport("pipeline", ("preprocessing", "tts_engine"), None, None, None, pid=0, state="STOPPED", restarts=0)
"""A CPU group whose worker is not running: every optional field absent."""
ON_GPU = GroupReport(
    "engine_tp1",
    ("tts_engine",),
    1,
    0.85,
    1,
    pid=41,
    state="READY",
    restarts=2,
    started_at=1700000000.25,
    fraction_enforced=True,
    physical_gpu="GPU-3",
    device="cuda:0 (NVIDIA H200, GPU-3)",
    resources=MEASURED,
    host="vm",
    node_id="ab" * 28,
    node="tts-a",
    autoscale=BOUNDS,
)
REPLICATED = GroupReport(
    "vocoder",
    ("vocoder",),
    None,
    None,
    None,
    pid=None,
    state="READY",
    restarts=1,
    fraction_enforced=True,
    node="tts-b",
    replicas=2,
    replica_gpus=(None, None),
    workers=(
        ReplicaReport("vocoder/0", 0, None, 200, "READY", 0, 1.5, None, "", UNMEASURED, "vm", "1" * 56, "tts-b"),
        ReplicaReport("vocoder/1", 1, None, 0, "BACKOFF", 1),
    ),
)
TOPOLOGY = TopologyReport(
    model="higgs-tts",
    model_path="bosonai/higgs-tts-3-4b",
    changed=True,
    groups=(SINGLE, ON_GPU, REPLICATED),
    stages=(
        StageReport("preprocessing", "pipeline", None, 1, None, None),
        StageReport("tts_engine", "engine", (0, 1), 2, 0.85, "declared", stand_in=True),
        StageReport("vocoder", "vocoder", 0, 1, 0.1, "recommended"),
    ),
    edges=(
        EdgeReport("preprocessing", "tts_engine", "next", True, True, "grpc", "pipeline", "engine_tp0", {"grpc": 3}),
        EdgeReport("tts_engine", "vocoder", "stream_to", False, True),
    ),
    gpus=(GpuReport(0, 0.95, 1.0, ("engine_tp0", "vocoder"), 80 << 30, 0, True), GpuReport(1, 0.85, 1.0, ())),
    warnings=("vocoder: explicit 0.05 below the recommended 0.10",),
)
EMPTY_TOPOLOGY = TopologyReport(None, None, False, (), (), (), ())
STATUS = StatusReport(
    state="DEGRADED",
    pid=7,
    uptime_seconds=12.5,
    groups_ready=1,
    groups_total=2,
    in_flight=3,
    root_cause=RootCause("b", "vocoder", "boom", "Traceback", 5.0),
    groups=(GroupStatus("a", "READY", 9, 0, MEASURED, "vm", "ab" * 28), GroupStatus("b", "BACKOFF", 0, 2)),
    workers_ready=1,
    workers_total=2,
    warnings=("group 'a' uses 300.0 MiB",),
    metrics_url="http://127.0.0.1:9464/metrics",
    missing_replicas=("vocoder/1",),
)
EMPTY_STATUS = StatusReport("STARTING", 1, 0.0, 0, 0, 0, None, (), 0, 0)
SUMMARY = SummaryReport(
    "SERVING",
    60.0,
    1,
    (GroupSummary("g1", "READY", 10, 0, 1, MEASURED), GroupSummary("g2", "BACKOFF", 0, 1, 0)),
    (StageSummary("a", "g1", 1, 7, 0.002, 0.01), StageSummary("b", "g2", 0, 0)),
    ("group 'g1' is over",),
)
EMPTY_SUMMARY = SummaryReport("STOPPED", 60.0, 0, (), ())

REPORTS = [TOPOLOGY, EMPTY_TOPOLOGY, STATUS, EMPTY_STATUS, SUMMARY, EMPTY_SUMMARY]
MESSAGES = {TopologyReport: admin_pb2.Topology, StatusReport: admin_pb2.Status, SummaryReport: admin_pb2.MetricsSummary}


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_a_report_comes_back_equal_from_its_proto_and_from_its_json(report):
    kind = type(report)
    wire = kind.from_proto(MESSAGES[kind].FromString(report.to_proto().SerializeToString()))
    assert wire == report
    assert kind.from_json(json.loads(json.dumps(report.to_json()))) == report


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_a_message_comes_back_byte_identical_through_the_typed_form(report):
    kind = type(report)
    data = report.to_proto().SerializeToString()
    assert kind.from_proto(MESSAGES[kind].FromString(data)).to_proto().SerializeToString() == data


def test_absent_optional_fields_are_null_in_json_and_unset_on_the_wire():
    group = SINGLE.to_proto()
    assert not any(group.HasField(f) for f in ("gpu", "total_gpu_memory_fraction", "tp_rank", "resources", "node"))
    assert (group.replicas, list(group.workers)) == (0, [])  # a single worker sends no replica fields
    data = SINGLE.to_json()
    assert [data[k] for k in ("gpu", "total_gpu_memory_fraction", "tp_rank", "started_at", "resources")] == [None] * 5
    assert not {"replicas", "replica_gpus", "workers", "node", "autoscale"} & set(data)


def test_zero_measured_bytes_stay_zero_not_null():
    assert ON_GPU.to_proto().resources.HasField("gpu_memory_bytes")
    back = GroupReport.from_proto(ON_GPU.to_proto())
    assert back.resources is not None and back.resources.gpu_memory_bytes == 0
    assert GpuReport.from_proto(TOPOLOGY.gpus[0].to_proto()).measured_bytes == 0
    assert GroupResources.from_proto(UNMEASURED.to_proto()).gpu_memory_bytes is None


def test_a_replicated_group_shows_its_replicas_in_the_plan_s_order_and_no_pid_of_its_own():
    data = REPLICATED.to_json()
    keys = list(data)
    assert keys[:8] == [
        "name",
        "stages",
        "gpu",
        "total_gpu_memory_fraction",
        "tp_rank",
        "replicas",
        "replica_gpus",
        "node",
    ]
    assert keys[-1] == "workers" and data["pid"] is None
    assert [w["name"] for w in data["workers"]] == ["vocoder/0", "vocoder/1"]
    assert "node" in data["workers"][0] and "node" not in data["workers"][1]
    # Over the wire the group's pid is 0; read back it is None again, and a single worker's 0 stays 0.
    assert REPLICATED.to_proto().pid == 0 and GroupReport.from_proto(REPLICATED.to_proto()).pid is None
    assert GroupReport.from_proto(SINGLE.to_proto()).pid == 0


def test_json_keys_follow_the_plan_json_then_the_runtime_fields():
    assert list(ON_GPU.to_json()) == [
        *("name", "stages", "gpu", "total_gpu_memory_fraction", "tp_rank", "node", "autoscale"),
        *("pid", "state", "restarts", "started_at", "fraction_enforced", "physical_gpu", "device", "resources"),
        *("host", "node_id"),
    ]
    assert list(TOPOLOGY.edges[0].to_json()) == [
        *("src", "dst", "kind", "cross_process", "process_safe", "transport", "src_group", "dst_group", "requests")
    ]
    assert ON_GPU.to_json()["autoscale"]["target_stall_p90_seconds"] is None


def test_a_tp_stage_lists_one_gpu_per_rank_and_a_cpu_stage_none():
    cpu, tp, single = (s.to_json()["gpu"] for s in TOPOLOGY.stages)
    assert (cpu, tp, single) == (None, [0, 1], 0)
    assert [list(s.to_proto().gpu) for s in TOPOLOGY.stages] == [[], [0, 1], [0]]


def test_status_shows_missing_replicas_only_while_some_are_and_a_null_root_cause_when_healthy():
    assert STATUS.to_json()["missing_replicas"] == ["vocoder/1"]
    healthy = EMPTY_STATUS.to_json()
    assert "missing_replicas" not in healthy and healthy["root_cause"] is None
    assert not EMPTY_STATUS.to_proto().HasField("root_cause")


def test_a_plan_only_edge_reads_with_empty_runtime_fields():
    edge = EdgeReport.from_json({"src": "a", "dst": "b", "kind": "next", "cross_process": False, "process_safe": True})
    assert (edge.transport, edge.src_group, dict(edge.requests)) == ("", "", {})
