"""The daemon's metrics registry: finishing twice, span export, the report windows, empty series."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from stagevisor.supervisor.metrics import registry
from stagevisor.supervisor.metrics.buckets import bin_values, quantile
from stagevisor.supervisor.metrics.registry import WINDOW_SECONDS, DaemonMetrics
from tests.fakes import FakeClock
from tests.unit.metrics.exposition import parse, report


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The registry's monotonic clock, at 5000.0 until a test advances it."""
    fake = FakeClock(5000.0)
    monkeypatch.setattr(registry.time, "monotonic", fake)
    return fake


MODEL = frozenset({("model", "m")})
STAGE = frozenset({("stage", "c"), ("group", "g2")})


class Spans:
    """A span exporter that records what it was given, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.exported, self.shut = fail, [], False

    def export(self, timings, started, model, code, request_id) -> None:
        if self.fail:
            raise OSError("collector unreachable")
        self.exported.append((model, code, request_id))

    def shutdown(self) -> None:
        self.shut = True


class Handle:
    request_id, timings = "r-1", ()


def test_a_request_finished_twice_is_counted_once():
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    meter.audio(16000, 16000)
    meter.finish("OK")
    meter.finish("OK")
    meter.finish("INTERNAL")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_requests_total", MODEL | {("outcome", "success"), ("code", "OK")})] == 1
    assert ("stagevisor_requests_total", MODEL | {("outcome", "error"), ("code", "INTERNAL")}) not in samples
    assert samples[("stagevisor_requests_in_flight", MODEL)] == 0
    assert samples[("stagevisor_request_duration_seconds_count", MODEL)] == 1


def test_a_cancelled_request_is_counted_as_cancelled_and_times_nothing():
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    meter.audio(16000, 16000)
    meter.finish("CANCELLED")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_requests_total", MODEL | {("outcome", "cancelled"), ("code", "CANCELLED")})] == 1
    assert samples[("stagevisor_request_duration_seconds_count", MODEL)] == 0
    assert samples[("stagevisor_audio_seconds_total", MODEL)] == 0


def test_only_a_client_cancel_is_cancelled_a_deadline_or_limit_is_an_error_under_its_own_code():
    metrics = DaemonMetrics("m", {})
    for code in ("CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        meter = metrics.start_request()
        meter.audio(16000, 16000)
        meter.finish(code)
    samples = parse(metrics.registry)
    assert samples[("stagevisor_requests_total", MODEL | {("outcome", "cancelled"), ("code", "CANCELLED")})] == 1
    for code in ("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        assert samples[("stagevisor_requests_total", MODEL | {("outcome", "error"), ("code", code)})] == 1, code
        assert ("stagevisor_requests_total", MODEL | {("outcome", "cancelled"), ("code", code)}) not in samples
    assert samples[("stagevisor_request_duration_seconds_count", MODEL)] == 0
    # Each streamed audio, then failed or was cancelled: time to first audio is of successful requests only.
    assert samples[("stagevisor_time_to_first_audio_seconds_count", MODEL)] == 0


def test_a_successful_request_without_audio_times_its_latency_but_no_real_time_factor():
    metrics = DaemonMetrics("m", {})
    metrics.start_request().finish("OK")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_request_duration_seconds_count", MODEL)] == 1
    assert samples[("stagevisor_real_time_factor_count", MODEL)] == 0
    assert samples[("stagevisor_time_to_first_audio_seconds_count", MODEL)] == 0
    assert metrics.recent.figures(registry.time.monotonic(), 3600).requests == 0  # no first audio to remember


def test_a_successful_request_with_audio_is_remembered_for_the_autoscaler():
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    meter.audio(16000, 16000)
    meter.finish("OK")
    metrics.start_request().finish("INTERNAL")
    assert metrics.recent.figures(registry.time.monotonic(), 3600).requests == 1


def test_chunks_without_a_sample_rate_add_no_audio_seconds():
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    meter.audio(16000, 0)
    meter.finish("OK")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_audio_seconds_total", MODEL)] == 0
    assert samples[("stagevisor_time_to_first_audio_seconds_count", MODEL)] == 1


def test_each_request_exports_its_spans_with_its_outcome_and_id():
    spans = Spans()
    metrics = DaemonMetrics("m", {}, spans=spans)
    meter = metrics.start_request()
    assert meter.exports_spans
    meter.attach(Handle())
    meter.finish("OK")
    assert spans.exported == [("m", "OK", "r-1")]
    assert not DaemonMetrics("m", {}).start_request().exports_spans


def test_a_span_export_that_fails_is_logged_and_the_request_still_counted(caplog):
    metrics = DaemonMetrics("m", {}, spans=Spans(fail=True))
    meter = metrics.start_request()
    meter.attach(Handle())
    with caplog.at_level(logging.WARNING, logger=registry.log.name):
        meter.finish("OK")
    assert any("could not export the spans of a request" in r.getMessage() for r in caplog.records)
    assert parse(metrics.registry)[("stagevisor_requests_total", MODEL | {("outcome", "success"), ("code", "OK")})]


def test_closing_shuts_the_span_exporter_down():
    spans = Spans()
    DaemonMetrics("m", {}, spans=spans).close()
    assert spans.shut
    DaemonMetrics("m", {}).close()  # nothing to shut


def test_an_unknown_stage_has_nothing_in_flight_and_an_empty_window():
    metrics = DaemonMetrics("m", {"c": "g2"})
    assert metrics.stage_in_flight("x", {"g2": 1}) == 0
    assert metrics.stage_window("x") == (0, None, None)


def timed(pid: int, count: int, seconds: float):
    message = report(pid, 0, 0)
    item = message.stages[0]
    item.count, item.calls, item.sum = count, count, seconds * count
    del item.buckets[:]
    item.buckets.extend(bin_values([seconds] * count))
    return message


def test_the_window_counts_only_the_reports_of_its_last_minute():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    metrics.apply_report(timed(1, 5, 0.5))  # slow calls, soon outside the window
    clock.advance(WINDOW_SECONDS + 1)
    metrics.apply_report(timed(1, 3, 0.01))
    calls, p50, p99 = metrics.stage_window("c")
    assert calls == 3 and p50 is not None and p99 is not None and p99 < 0.5
    clock.advance(WINDOW_SECONDS / 2)
    metrics.apply_report(timed(1, 2, 0.01))
    assert metrics.stage_window("c")[0] == 5


def test_a_window_whose_last_report_is_a_minute_old_is_empty():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    metrics.apply_report(timed(1, 4, 0.01))
    assert metrics.stage_window("c")[0] == 4
    clock.advance(WINDOW_SECONDS)
    assert metrics.stage_window("c") == (0, None, None)


def test_the_history_keeps_one_report_older_than_the_window_and_no_more():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    for _ in range(10):
        metrics.apply_report(timed(1, 1, 0.01))
        clock.advance(WINDOW_SECONDS / 4)
    history = metrics.stages["c"].history
    assert len(history) == 5  # the four within the last minute, and the base before them
    assert history[1][0] > clock() - WINDOW_SECONDS - WINDOW_SECONDS / 4


def test_a_report_with_nothing_new_adds_no_history():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(report(1, 0, 0, in_flight=2, calls=0))
    assert len(metrics.stages["c"].history) == 0 and metrics.stage_in_flight("c", {"g2": 1}) == 2


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


def test_the_gap_between_chunks_is_the_time_from_one_to_the_next(clock):
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    clock.advance(0.5)
    meter.audio(100, 1000)
    clock.advance(0.25)
    meter.audio(100, 1000)
    meter.finish("OK")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_time_to_first_audio_seconds_sum", MODEL)] == 0.5
    assert samples[("stagevisor_audio_chunk_gap_seconds_sum", MODEL)] == 0.25
    assert samples[("stagevisor_audio_chunk_gap_seconds_count", MODEL)] == 1


def test_a_report_exactly_a_window_old_is_the_base_of_the_window():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    metrics.apply_report(timed(1, 5, 0.01))
    clock.advance(WINDOW_SECONDS / 2)
    metrics.apply_report(timed(1, 3, 0.01))
    clock.advance(WINDOW_SECONDS / 2)  # the first report is now exactly a window old: outside it
    assert metrics.stage_window("c")[0] == 3


def test_a_window_of_recent_reports_only_counts_and_times_exactly_their_calls():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(timed(1, 10, 0.01))
    expected = bin_values([0.01] * 10)
    assert metrics.stage_window("c") == (10, quantile(0.5, expected), quantile(0.99, expected))


def test_a_stage_reporting_less_often_than_the_window_keeps_two_reports():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    for _ in range(3):
        metrics.apply_report(timed(1, 1, 0.01))
        clock.advance(2 * WINDOW_SECONDS)
    assert len(metrics.stages["c"].history) == 2


def test_every_group_s_budget_warnings_are_exported_from_zero_before_any_warning():
    samples = parse(DaemonMetrics("m", {"a": "g1", "b": "g2", "c": "g2"}).registry)
    warnings = {dict(labels)["group"]: value for (name, labels), value in samples.items() if "budget_warnings" in name}
    assert warnings == {"g1": 0, "g2": 0}


def test_a_gpu_listed_after_one_without_a_measurement_is_still_exported():
    gpus = [
        {"id": 0, "measured_bytes": None, "total_bytes": 100, "limit": 0.5},
        {"id": 1, "measured_bytes": 10, "total_bytes": 100, "limit": 0.5, "over_limit": False},
    ]
    samples = parse(DaemonMetrics("m", {}, gpus=lambda: gpus).registry)
    assert samples[("stagevisor_gpu_memory_used_bytes", frozenset({("gpu", "1")}))] == 10


class TimingsSeen(Spans):
    """A span exporter that also keeps the RequestTimings and the start time it was given."""

    def export(self, timings, started, model, code, request_id) -> None:
        self.timings, self.started = timings, started
        super().export(timings, started, model, code, request_id)


def test_the_spans_exported_are_the_attached_request_s_stage_timings(clock):
    spans = TimingsSeen()
    metrics = DaemonMetrics("m", {"c": "g2"}, spans=spans)
    meter = metrics.start_request()
    handle = Handle()
    handle.timings = [("c", 5000.25, 5000.75)]
    meter.attach(handle)
    clock.advance(1.0)
    meter.finish("OK")
    [stage] = spans.timings.stages
    assert (stage.stage, stage.group, stage.start_seconds, stage.duration_seconds) == ("c", "g2", 0.25, 0.5)
    assert spans.timings.total_seconds == 1.0


def test_latency_and_real_time_factor_are_the_request_s_time_over_its_audio(clock):
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    clock.advance(0.5)
    meter.audio(500, 1000)  # half a second of audio
    clock.advance(1.5)
    meter.finish("OK")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_request_duration_seconds_sum", MODEL)] == 2.0
    assert samples[("stagevisor_real_time_factor_sum", MODEL)] == 4.0
    assert samples[("stagevisor_audio_seconds_total", MODEL)] == 0.5


def test_a_failed_span_export_is_logged_with_its_error(caplog):
    metrics = DaemonMetrics("m", {}, spans=Spans(fail=True))
    meter = metrics.start_request()
    meter.attach(Handle())
    with caplog.at_level(logging.WARNING, logger=registry.log.name):
        meter.finish("OK")
    [record] = [r for r in caplog.records if r.getMessage() == "could not export the spans of a request"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], OSError)


def test_a_stage_reporting_calls_without_timings_counts_them_in_its_window_and_no_failures():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(report(1, 0, 0, calls=4))
    assert metrics.stage_window("c") == (4, None, None)
    assert parse(metrics.registry)[("stagevisor_stage_failures_total", STAGE)] == 0


def test_the_window_times_only_the_calls_since_its_base():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    metrics.apply_report(timed(1, 5, 0.5))
    clock.advance(61.0)
    metrics.apply_report(timed(1, 3, 0.01))
    recent = bin_values([0.01] * 3)
    assert metrics.stage_window("c") == (3, quantile(0.5, recent), quantile(0.99, recent))


def test_the_window_is_the_last_sixty_seconds():
    clock = FakeClock(1000.0)
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=clock)
    metrics.apply_report(timed(1, 2, 0.01))
    clock.now = 1030.0
    metrics.apply_report(timed(1, 3, 0.01))
    clock.now = 1059.0  # the first report is 59 s old: inside
    assert metrics.stage_window("c")[0] == 5
    clock.now = 1060.0  # 60 s old: outside
    assert metrics.stage_window("c")[0] == 3


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


def test_playback_stalls_when_a_chunk_arrives_after_the_audio_before_it_has_played(clock):
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    clock.advance(0.25)
    meter.audio(500, 1000)  # half a second of audio: it plays until 5000.75
    clock.advance(1.0)
    meter.audio(250, 1000)  # arrives at 5001.25: half a second late
    meter.finish("OK")
    samples = parse(metrics.registry)
    assert samples[("stagevisor_playback_stall_seconds_sum", MODEL)] == 0.5
    figures = metrics.recent.figures(clock(), 3600)
    assert (figures.requests, figures.first_audio_p90, figures.stall_p90) == (1, 0.25, 0.5)


def test_a_daemon_without_a_model_name_labels_its_requests_custom():
    metrics = DaemonMetrics(None, {})
    metrics.start_request().finish("OK")
    samples = parse(metrics.registry)
    custom = frozenset({("model", "custom")})
    assert samples[("stagevisor_requests_total", custom | {("outcome", "success"), ("code", "OK")})] == 1
    assert samples[("stagevisor_requests_in_flight", custom)] == 0


def test_stage_failures_and_edge_latencies_add_up_over_reports():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    for failures in (2, 3):
        message = report(11, 1, 2)
        message.stages[0].failures = failures
        metrics.apply_report(message)
    samples = parse(metrics.registry)
    edge = frozenset({("src", "b"), ("dst", "c"), ("transport", "grpc")})
    assert samples[("stagevisor_stage_failures_total", STAGE)] == 5
    assert samples[("stagevisor_edge_handoff_latency_seconds_sum", edge)] == 0.004  # 2 x 2 handoffs of 1 ms
    assert samples[("stagevisor_edge_handoff_latency_seconds_count", edge)] == 4


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


def test_a_request_s_timings_are_taken_once_and_its_spans_end_where_they_were_first_read(clock):
    spans = TimingsSeen()
    metrics = DaemonMetrics("m", {}, spans=spans)
    meter = metrics.start_request()
    meter.attach(Handle())
    clock.advance(1.0)
    first = meter.timings()
    clock.advance(2.0)
    meter.finish("OK")
    assert spans.timings is first and first.total_seconds == 1.0


def test_a_group_exports_one_state_series_per_lifecycle_state_with_1_on_its_own():
    from stagevisor.supervisor.daemon.lifecycle import GroupState

    for current in GroupState:
        groups = [{"name": "g", "state": current.name}]
        samples = parse(DaemonMetrics("m", {}, groups=lambda groups=groups: groups).registry)
        states = {dict(key)["state"]: v for (name, key), v in samples.items() if name == "stagevisor_group_state"}
        assert states == {state.name: (1.0 if state is current else 0.0) for state in GroupState}


def test_a_stage_s_processing_time_adds_up_over_reports():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(timed(1, 2, 0.25))
    metrics.apply_report(timed(1, 4, 0.125))
    samples = parse(metrics.registry)
    assert samples[("stagevisor_stage_processing_seconds_sum", STAGE)] == 1.0
    assert samples[("stagevisor_stage_processing_seconds_count", STAGE)] == 6


def test_a_chunk_without_a_rate_adds_no_playback_time(clock):
    metrics = DaemonMetrics("m", {})
    meter = metrics.start_request()
    meter.audio(100, 0)  # no rate: no duration
    clock.advance(0.25)
    meter.audio(500, 1000)  # plays until 5000.75
    clock.advance(1.0)
    meter.audio(250, 1000)  # half a second late
    meter.finish("OK")
    assert parse(metrics.registry)[("stagevisor_playback_stall_seconds_sum", MODEL)] == 0.5


def test_a_group_with_empty_resources_exports_its_state_only():
    groups = [{"name": "g", "state": "READY", "resources": {}}]
    samples = parse(DaemonMetrics("m", {}, groups=lambda: groups).registry)
    assert samples[("stagevisor_group_state", frozenset({("group", "g"), ("state", "READY")}))] == 1
    assert ("stagevisor_group_resident_memory_bytes", frozenset({("group", "g")})) not in samples


def test_a_stage_that_reported_only_calls_in_flight_has_an_empty_window():
    metrics = DaemonMetrics("m", {"c": "g2"}, clock=FakeClock())
    metrics.apply_report(report(1, 0, 0, in_flight=3, calls=0))
    assert metrics.stage_window("c") == (0, None, None)


def test_the_spans_carry_the_request_s_start_and_its_time_to_first_audio(clock):
    spans = TimingsSeen()
    metrics = DaemonMetrics("m", {}, spans=spans)
    meter = metrics.start_request()
    meter.attach(Handle())
    clock.advance(0.25)
    meter.audio(100, 1000)
    clock.advance(1.0)
    meter.finish("OK")
    assert spans.started == 5000.0
    assert (spans.timings.first_audio_seconds, spans.timings.total_seconds) == (0.25, 1.25)


def test_the_stage_to_group_map_is_the_one_given_at_construction():
    stage_groups = {"c": "g2"}
    metrics = DaemonMetrics("m", stage_groups)
    stage_groups["d"] = "g3"
    assert metrics.stage_groups == {"c": "g2"}


def test_the_real_time_factor_histogram_uses_its_own_bounds():
    from stagevisor.supervisor.metrics.buckets import RTF_BOUNDS

    samples = parse(DaemonMetrics("m", {}).registry)
    bounds = sorted(
        float(dict(labels)["le"])
        for (name, labels), _ in samples.items()
        if name == "stagevisor_real_time_factor_bucket" and dict(labels)["le"] != "+Inf"
    )
    assert bounds == sorted(RTF_BOUNDS)


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


def test_a_request_counts_in_flight_only_from_its_admission_not_while_queued_or_refused():
    """A request waiting in the admission queue, or refused there (429), is not in flight: the gauge
    must never exceed --max-concurrent-requests."""
    metrics = DaemonMetrics("m", {})
    queued, refused = metrics.start_request(), metrics.start_request()
    assert parse(metrics.registry)[("stagevisor_requests_in_flight", MODEL)] == 0
    refused.finish("RESOURCE_EXHAUSTED")
    queued.attach(Handle())
    assert parse(metrics.registry)[("stagevisor_requests_in_flight", MODEL)] == 1
    queued.finish("OK")
    assert parse(metrics.registry)[("stagevisor_requests_in_flight", MODEL)] == 0
