"""The daemon's metrics at scrape time (supervisor/metrics/collector.py): stages, edges, admission, groups, GPUs."""

from __future__ import annotations

from prometheus_client import generate_latest

from stagevisor.supervisor.metrics.registry import DaemonMetrics
from tests.fakes import FakeClock
from tests.unit.metrics.exposition import parse, report

MODEL = frozenset({("model", "m")})
STAGE = frozenset({("stage", "c"), ("group", "g2")})


def test_a_stage_that_never_reported_is_exported_with_zeros():
    metrics = DaemonMetrics("m", {"c": "g2"})
    samples = parse(metrics.registry)
    assert samples[("stagevisor_stage_calls_total", STAGE)] == 0
    assert samples[("stagevisor_stage_failures_total", STAGE)] == 0
    assert samples[("stagevisor_stage_processing_seconds_count", STAGE)] == 0
    assert samples[("stagevisor_stage_processing_seconds_bucket", STAGE | {("le", "+Inf")})] == 0


def test_a_gpu_without_a_measurement_or_a_total_is_not_exported():
    gpus = [
        {"id": 0, "measured_bytes": 10, "total_bytes": 100, "limit": 0.5, "over_limit": False},
        {"id": 1, "measured_bytes": None, "total_bytes": 100, "limit": 0.5},
        {"id": 2, "measured_bytes": 10, "total_bytes": None, "limit": 0.5},
    ]
    samples = parse(DaemonMetrics("m", {}, gpus=lambda: gpus).registry)
    assert samples[("stagevisor_gpu_memory_limit_bytes", frozenset({("gpu", "0")}))] == 50
    assert samples[("stagevisor_gpu_over_limit", frozenset({("gpu", "0")}))] == 0
    assert not any(name.startswith("stagevisor_gpu_") and ("gpu", "1") in labels for name, labels in samples)
    assert not any(name.startswith("stagevisor_gpu_") and ("gpu", "2") in labels for name, labels in samples)


def test_a_group_without_resources_exports_its_state_and_restarts_only():
    groups = [{"name": "g2", "state": "BACKOFF", "restarts": 3, "pid": 0}]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_state", frozenset({("group", "g2"), ("state", "BACKOFF")}))] == 1
    assert samples[("stagevisor_group_state", frozenset({("group", "g2"), ("state", "READY")}))] == 0
    assert samples[("stagevisor_group_restarts_total", frozenset({("group", "g2")}))] == 3
    assert not any(name == "stagevisor_group_resident_memory_bytes" for name, _ in samples)


def test_a_groups_restarts_never_go_down_when_an_apply_gives_it_a_new_runner():
    """An apply (or a scale) replaces a group's runner, whose restart count starts at 0 again: the counter went
    from 2 to 0 within one daemon's life."""
    groups = [{"name": "pipeline", "state": "READY", "restarts": 2, "pid": 1}]
    metrics = DaemonMetrics("m", {}, groups=lambda: groups)
    key = ("stagevisor_group_restarts_total", frozenset({("group", "pipeline")}))
    assert parse(metrics.registry)[key] == 2
    groups[0]["restarts"] = 0  # the apply's new runner
    assert parse(metrics.registry)[key] == 2
    groups[0]["restarts"] = 1
    assert parse(metrics.registry)[key] == 3


def test_a_new_runners_count_climbing_back_to_the_old_ones_between_scrapes_adds_its_restarts():
    """A scrape saw `pipeline` at 1 restart; an apply's new runner (a new count) restarted once before the next
    scrape, so the row read 1 again: the collector, comparing numbers only, added nothing."""
    groups = [{"name": "pipeline", "state": "READY", "restarts": 1, "restart_count_id": 7, "pid": 1}]
    metrics = DaemonMetrics("m", {}, groups=lambda: groups)
    key = ("stagevisor_group_restarts_total", frozenset({("group", "pipeline")}))
    assert parse(metrics.registry)[key] == 1
    groups[0].update(restart_count_id=8)  # the new runner, its count at 1 already
    assert parse(metrics.registry)[key] == 2
    groups[0].update(restarts=3)
    assert parse(metrics.registry)[key] == 4


def test_a_worker_a_scale_renames_brings_none_of_its_restarts_twice():
    """`vocoder` (2 restarts) becomes `vocoder/0` when scaled to two replicas, its runner and count the same: its
    new series counts the restarts from there on, the new replica's from its first; each restart is in one series."""
    groups = [{"name": "vocoder", "state": "READY", "restarts": 2, "restart_count_id": 3, "pid": 1}]
    metrics = DaemonMetrics("m", {}, groups=lambda: groups)
    assert parse(metrics.registry)[("stagevisor_group_restarts_total", frozenset({("group", "vocoder")}))] == 2
    groups[:] = [
        {"name": "vocoder/0", "state": "READY", "restarts": 3, "restart_count_id": 3, "pid": 1},
        {"name": "vocoder/1", "state": "READY", "restarts": 1, "restart_count_id": 4, "pid": 2},
    ]
    samples = parse(metrics.registry)
    assert samples[("stagevisor_group_restarts_total", frozenset({("group", "vocoder/0")}))] == 1
    assert samples[("stagevisor_group_restarts_total", frozenset({("group", "vocoder/1")}))] == 1


def test_a_retired_runners_restarts_since_the_last_scrape_count_for_its_name_and_export_nothing_else():
    """An apply retired `pipeline`'s runner after it restarted once, before any scrape saw it: the daemon hands
    it over once more as a `retired` row, whose restart counts for `pipeline` beside its new runner's."""
    groups = [{"name": "pipeline", "state": "READY", "restarts": 0, "restart_count_id": 1, "pid": 1}]
    metrics = DaemonMetrics("m", {}, groups=lambda: groups)
    key = ("stagevisor_group_restarts_total", frozenset({("group", "pipeline")}))
    assert parse(metrics.registry)[key] == 0
    groups[:] = [
        {"name": "pipeline", "state": "READY", "restarts": 0, "restart_count_id": 2, "pid": 2},
        {"name": "pipeline", "retired": True, "restarts": 1, "restart_count_id": 1},
    ]
    text = generate_latest(metrics.registry).decode()
    assert parse(metrics.registry)[key] == 1
    assert text.count('stagevisor_group_state{group="pipeline",state="READY"}') == 1


def group_with(name: str, gpu, **resources) -> dict:
    measured = {
        "rss_bytes": 100,
        "cpu_seconds": 2.5,
        "threads": 7,
        "open_fds": 11,
        "gpu_memory_bytes": 300,
        "memory_budget_bytes": 200,
        "budget_kind": "gpu_fraction",
        "over_budget": False,
    }
    return {
        "name": name,
        "state": "READY",
        "pid": 5,
        "restarts": 1,
        "consecutive_crashes": 2,
        "silent": True,
        "gpu": gpu,
        "resources": {**measured, **resources},
    }


def test_a_groups_measured_resources_are_exported_each_under_its_own_name():
    samples = parse(DaemonMetrics("m", {}, groups=lambda: [group_with("g", 1, over_budget=True)]).registry)
    g = frozenset({("group", "g")})
    assert samples[("stagevisor_group_resident_memory_bytes", g)] == 100
    assert samples[("stagevisor_group_cpu_seconds_total", g)] == 2.5
    assert samples[("stagevisor_group_threads", g)] == 7
    assert samples[("stagevisor_group_open_fds", g)] == 11
    assert samples[("stagevisor_group_consecutive_crashes", g)] == 2
    assert samples[("stagevisor_group_silent", g)] == 1
    assert samples[("stagevisor_group_gpu_memory_used_bytes", g | {("gpu", "1")})] == 300
    assert samples[("stagevisor_group_memory_budget_bytes", g | {("kind", "gpu_fraction")})] == 200
    assert samples[("stagevisor_group_over_budget", g)] == 1


def test_a_group_within_its_budget_is_not_flagged_and_one_without_a_gpu_or_budget_exports_neither():
    groups = [
        group_with("within", 0),
        group_with("cpu", None, memory_budget_bytes=None),
        group_with("unmeasured", 0, gpu_memory_bytes=None),
    ]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_over_budget", frozenset({("group", "within")}))] == 0
    used = {dict(labels)["group"] for name, labels in samples if name == "stagevisor_group_gpu_memory_used_bytes"}
    budgets = {dict(labels)["group"] for name, labels in samples if name == "stagevisor_group_memory_budget_bytes"}
    assert used == {"within"} and budgets == {"within", "unmeasured"}


def test_a_gpu_over_its_limit_is_flagged_and_its_limit_is_the_fraction_of_its_memory():
    gpus = [{"id": 3, "measured_bytes": 90, "total_bytes": 200, "limit": 0.4, "over_limit": True}]
    samples = parse(DaemonMetrics("m", {}, gpus=lambda: gpus).registry)
    gpu = frozenset({("gpu", "3")})
    assert samples[("stagevisor_gpu_memory_used_bytes", gpu)] == 90
    assert samples[("stagevisor_gpu_memory_limit_bytes", gpu)] == 80
    assert samples[("stagevisor_gpu_over_limit", gpu)] == 1


EDGE = frozenset({("src", "b"), ("dst", "c"), ("transport", "grpc")})


def test_a_stage_that_reported_calls_but_no_timings_has_a_zero_sum_and_an_edge_without_traffic_zero_counts():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(report(1, 0, 0, calls=4))  # four calls, none timed; an edge that carried nothing
    samples = parse(metrics.registry)
    assert samples[("stagevisor_stage_calls_total", STAGE)] == 4
    assert samples[("stagevisor_stage_processing_seconds_sum", STAGE)] == 0
    assert samples[("stagevisor_stage_processing_seconds_count", STAGE)] == 0
    assert samples[("stagevisor_edge_chunks_total", EDGE)] == 0
    assert samples[("stagevisor_edge_handoff_latency_seconds_count", EDGE)] == 0
    assert samples[("stagevisor_edge_handoff_latency_seconds_sum", EDGE)] == 0


def test_a_stage_that_never_reported_has_a_zero_sum_and_nothing_is_queued_without_admission():
    samples = parse(DaemonMetrics("m", {"c": "g2"}).registry)
    assert samples[("stagevisor_stage_processing_seconds_sum", STAGE)] == 0
    assert samples[("stagevisor_requests_queued", MODEL)] == 0
    assert not any(name == "stagevisor_admission_rejections_total" for name, _ in samples)


def test_a_group_reporting_no_restarts_or_crashes_counts_zero_of_each():
    groups = [{"name": "g", "state": "READY"}]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_restarts_total", frozenset({("group", "g")}))] == 0
    assert samples[("stagevisor_group_consecutive_crashes", frozenset({("group", "g")}))] == 0
    assert samples[("stagevisor_group_silent", frozenset({("group", "g")}))] == 0


def test_a_gpu_listed_after_one_without_a_measurement_is_still_exported():
    gpus = [
        {"id": 0, "measured_bytes": None, "total_bytes": 100, "limit": 0.5},
        {"id": 1, "measured_bytes": 10, "total_bytes": 100, "limit": 0.5, "over_limit": False},
    ]
    samples = parse(DaemonMetrics("m", {}, gpus=lambda: gpus).registry)
    assert samples[("stagevisor_gpu_memory_used_bytes", frozenset({("gpu", "1")}))] == 10


def test_a_running_worker_s_in_flight_calls_are_exported_under_its_stage():
    groups = [{"name": "g2", "state": "READY", "pid": 11}]
    metrics = DaemonMetrics("m", {"c": "g2"}, groups=lambda: groups, clock=FakeClock())
    metrics.apply_report(report(11, 0, 0, in_flight=2, calls=0))
    assert parse(metrics.registry)[("stagevisor_stage_in_flight", STAGE)] == 2


def test_admission_rejections_are_exported_by_reason_with_the_queue_length():
    from stagevisor.supervisor.dataplane.admission import Admission

    metrics = DaemonMetrics("m", {})
    metrics.admission = Admission()
    metrics.admission.reject("BUSY")
    metrics.admission.reject("BUSY")
    metrics.admission.reject("DRAINING")
    samples = parse(metrics.registry)
    rejected = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "stagevisor_admission_rejections_total"
    }
    assert rejected == {"BUSY": 2, "QUEUE_TIMEOUT": 0, "DRAINING": 1, "STARTING": 0, "GROUP_FAILED": 0, "GROUP_DOWN": 0}
    assert samples[("stagevisor_requests_queued", MODEL)] == 0


def test_a_group_listed_after_one_without_resources_still_exports_its_own():
    groups = [{"name": "idle", "state": "BACKOFF"}, group_with("busy", None)]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_resident_memory_bytes", frozenset({("group", "busy")}))] == 100


def test_an_in_process_edge_counts_handoffs_and_chunks_but_exports_no_bytes():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    for transport in ("in_process", "shm"):
        message = report(11, 0, 3)
        message.edges[0].transport = transport
        message.edges[0].chunks = 7
        metrics.apply_report(message)
    samples = parse(metrics.registry)
    local = frozenset({("src", "b"), ("dst", "c"), ("transport", "in_process")})
    shared = frozenset({("src", "b"), ("dst", "c"), ("transport", "shm")})
    assert samples[("stagevisor_edge_handoffs_total", local)] == 3
    assert samples[("stagevisor_edge_chunks_total", local)] == 7
    assert ("stagevisor_edge_bytes_total", local) not in samples
    assert samples[("stagevisor_edge_bytes_total", shared)] == 300


def test_the_requests_waiting_for_admission_are_exported():
    from types import SimpleNamespace

    metrics = DaemonMetrics("m", {})
    metrics.admission = SimpleNamespace(queued=3, rejected={})
    assert parse(metrics.registry)[("stagevisor_requests_queued", MODEL)] == 3


def test_a_group_exports_one_state_series_per_lifecycle_state_with_1_on_its_own():
    from stagevisor.supervisor.daemon.lifecycle import GroupState

    for current in GroupState:
        groups = [{"name": "g", "state": current.name}]
        samples = parse(DaemonMetrics("m", {}, groups=lambda groups=groups: groups).registry)
        states = {dict(key)["state"]: v for (name, key), v in samples.items() if name == "stagevisor_group_state"}
        assert states == {state.name: (1.0 if state is current else 0.0) for state in GroupState}


def test_a_group_with_empty_resources_exports_its_state_only():
    groups = [{"name": "g", "state": "READY", "resources": {}}]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_state", frozenset({("group", "g"), ("state", "READY")}))] == 1
    assert ("stagevisor_group_resident_memory_bytes", frozenset({("group", "g")})) not in samples


def test_edges_are_exported_in_a_stable_order_whatever_order_they_reported_in():
    from prometheus_client import generate_latest

    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    for src in ("z", "a", "m"):
        message = report(11, 0, 1)
        message.edges[0].src = src
        metrics.apply_report(message)
    text = generate_latest(metrics.registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("stagevisor_edge_handoffs_total{")]
    assert [line.split('src="')[1][0] for line in lines] == ["a", "m", "z"]


def test_every_histogram_family_writes_its_bucket_bounds_alike():
    """stage_processing_seconds (the collector's) wrote `le="1"` where request_duration_seconds (a client Histogram)
    wrote `le="1.0"`: one bound, two spellings, so a query joining the two by `le` matched nothing."""
    from prometheus_client.parser import text_string_to_metric_families

    metrics = DaemonMetrics("m", {"c": "g2"})
    text = generate_latest(metrics.registry).decode()
    bounds: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bounds.setdefault(sample.labels["le"], set()).add(family.name)
    spellings: dict[float, set[str]] = {}
    for le in bounds:
        spellings.setdefault(float(le), set()).add(le)
    assert bounds["1.0"] >= {"stagevisor_stage_processing_seconds", "stagevisor_request_duration_seconds"}
    assert {bound: les for bound, les in spellings.items() if len(les) > 1} == {}


def test_the_handoff_counter_says_it_counts_the_handoffs_of_failed_and_cancelled_requests_too():
    """Its HELP said "Requests handed over an edge" where `stagevisor topology`'s per-edge count, also "requests",
    leaves failed and cancelled ones out: the HELP names the difference."""
    help_text = next(
        line
        for line in generate_latest(DaemonMetrics("m", {"c": "g2"}).registry).decode().splitlines()
        if line.startswith("# HELP stagevisor_edge_handoffs_total ")
    )
    assert "failed or was cancelled" in help_text and "`stagevisor topology` counts completed" in help_text


def test_the_metrics_reference_names_every_transport_an_edge_is_counted_under():
    """deploy/README.md listed in_process, grpc and shared_memory for the edge series' `transport`; a worker on
    another node (--launcher ray) counts its edges under grpc_tcp, which a dashboard filtering by the list missed."""
    from pathlib import Path

    from stagevisor.supervisor.dataplane.trace import GRPC, GRPC_TCP, IN_PROCESS
    from stagevisor.supervisor.metrics.recorder import SHARED_MEMORY

    readme = (Path(__file__).resolve().parents[3] / "deploy" / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `stagevisor_edge_handoffs_total`"))
    labels = row.split("|")[3]
    assert all(transport in labels for transport in (IN_PROCESS, GRPC, GRPC_TCP, SHARED_MEMORY)), labels
