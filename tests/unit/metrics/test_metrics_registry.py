"""The daemon's metrics registry: request meters (finishing twice, span export), report windows, totals."""

from __future__ import annotations

import logging

import pytest

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
