"""The daemon's reports: each round-trips proto <-> typed <-> JSON, defaults and empty values included."""

from __future__ import annotations

import json

import pytest

from stagevisor.supervisor.reports import (
    EdgeReport,
    GpuReport,
    GroupReport,
    GroupResources,
    StatusReport,
)

from tests.unit.reports.samples import (
    EMPTY_STATUS,
    MESSAGES,
    ON_GPU,
    REPLICATED,
    REPORTS,
    SINGLE,
    STATUS,
    TOPOLOGY,
    UNMEASURED,
)


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
    optional = ("gpu", "total_gpu_memory_fraction", "tp_rank", "resources", "node", "silent_s")
    assert not any(group.HasField(f) for f in optional)
    assert (group.replicas, list(group.workers)) == (0, [])  # a single worker sends no replica fields
    data = SINGLE.to_json()
    nullable = ("gpu", "total_gpu_memory_fraction", "tp_rank", "started_at", "resources", "silent_s")
    assert [data[k] for k in nullable] == [None] * 6
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
        *("host", "node_id", "silent_s"),
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


def test_status_counts_one_request_in_flight_in_the_singular():
    """`stagevisor status` read `groups: 1/2 READY, 1 requests in flight`."""
    from dataclasses import replace

    from stagevisor.supervisor.commands.report_text import format_status

    assert "groups: 1/2 READY, 1 worker silent (a), 1 request in flight" in format_status(replace(STATUS, in_flight=1))
    assert "groups: 1/2 READY, 1 worker silent (a), 3 requests in flight" in format_status(STATUS)


def test_a_gpu_with_no_declared_fraction_stays_null_through_the_wire_and_a_declared_zero_share_does_not_appear():
    """The admin API's GpuBudget total was a plain double: a GPU with nothing declared came back as 0.0."""
    undeclared = GpuReport(0, None, 1.0, ("pipeline",))
    assert GpuReport.from_proto(undeclared.to_proto()).total_gpu_memory_fraction is None
    assert GpuReport.from_proto(GpuReport(0, 0.5, 1.0, ("p",)).to_proto()).total_gpu_memory_fraction == 0.5


def test_a_worker_s_silence_is_null_while_it_beats_and_a_report_of_a_daemon_from_before_silent_s_reads_as_beating():
    assert STATUS.to_json()["groups"][0]["silent_s"] == 3.25 and STATUS.to_json()["groups"][1]["silent_s"] is None
    assert REPLICATED.to_json()["workers"][0]["silent_s"] == 0.0 and REPLICATED.to_json()["silent_s"] is None
    older = STATUS.to_json()
    for group in older["groups"]:
        del group["silent_s"]
    assert [g.silent_s for g in StatusReport.from_json(older).groups] == [None, None]
    wire = STATUS.to_proto()
    wire.groups[0].ClearField("silent_s")  # what a daemon from before the field sends
    assert StatusReport.from_proto(wire).groups[0].silent_s is None
