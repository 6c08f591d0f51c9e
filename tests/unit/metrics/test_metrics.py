"""Metrics without processes or ports: worker recording in the runtime, daemon accumulation and export,
buckets and quantiles, resource sampling against budgets, request timings, top's view, OpenTelemetry."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stagevisor.supervisor.commands.report_text import event_json, format_event, format_status
from stagevisor.supervisor.reports import StatusReport, SummaryReport
from stagevisor.supervisor.commands.top import render
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.dataplane.trace import timing_tuples
from stagevisor.supervisor.daemon.lifecycle import GroupState
from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS, bin_values, quantile
from stagevisor.supervisor.daemon.monitor import ConditionEvent
from stagevisor.supervisor.metrics.recorder import Recorder
from stagevisor.supervisor.metrics.registry import DaemonMetrics
from stagevisor.supervisor.metrics.resources import GpuProbe, ResourceSampler, parse_rss_budgets, parse_size
from stagevisor.supervisor.metrics.timings import SpanExporter, format_waterfall, otlp_configured, request_timings
from stagevisor.supervisor.plan import GpuBudget, Plan, PlannedStage, ProcessGroup

from tests.fakes import RecordedLinks, poll_until
from tests.unit.metrics.exposition import parse, report
from tests.unit.dataplane.runtime_driver import inbound_link, planned, submit

SINK = "unix:/nonexistent/sink.sock"


class Echo:
    async def process(self, payload, ctx):
        return dict(payload.data)


class Streamer:
    async def process(self, payload, ctx):
        for i in range(3):
            await ctx.stream({"i": i})
        return {"done": True}


class Drain:
    async def process(self, payload, ctx):
        return {"got": [c async for c in ctx.chunks()]}


def recording_runtime(stages, executors, routes=None, group="g", **recorder_options):
    recorder = Recorder(group, pid=1234, **recorder_options)
    runtime = StageRuntime(
        {s.name: s for s in stages}, executors, routes or {}, SINK, group, Codec(), recorder=recorder
    )
    runtime.links = RecordedLinks()
    return runtime, recorder


# ---- buckets ---------------------------------------------------------------------------


def test_values_land_in_le_buckets_and_quantiles_interpolate_inside_them():
    counts = bin_values([0.001, 0.001, 0.02, 100.0])
    assert counts[LATENCY_BOUNDS.index(0.001)] == 2 and counts[-1] == 1 and sum(counts) == 4
    assert quantile(0.5, counts) == pytest.approx(0.001)
    assert LATENCY_BOUNDS.index(0.01) < LATENCY_BOUNDS.index(0.025)
    assert 0.01 < quantile(0.75, counts) <= 0.025
    assert quantile(0.99, counts) == LATENCY_BOUNDS[-1]
    assert quantile(0.5, [0] * len(counts)) is None


# ---- the worker side: runtime + recorder -----------------------------------------------


def test_in_process_chain_counts_each_stage_and_handoff_and_reports_timings_with_done():
    async def scenario():
        runtime, recorder = recording_runtime(
            [planned("a", next=["b"]), planned("b", next=["c"], stream_to=["c"]), planned("c")],
            {"a": Echo(), "b": Streamer(), "c": Drain()},
        )
        for request_id in ("r1", "r2"):
            submit(runtime, "a", request_id=request_id, request={"text": "hi", "options": {}, "timings": True})
        assert await poll_until(lambda: runtime.links.bodies(SINK).count("done") == 2)
        report = recorder.collect()
        stages = {s.stage: s for s in report.stages}
        assert {name: stages[name].count for name in "abc"} == {"a": 2, "b": 2, "c": 2}
        assert all(sum(s.buckets) == s.count and s.in_flight == 0 for s in stages.values())
        edges = {(e.src, e.dst, e.transport): e for e in report.edges}
        assert edges[("a", "b", "in_process")].handoffs == 2
        assert edges[("b", "c", "in_process")].handoffs == 2  # the stream opening, once per request
        assert edges[("a", "b", "in_process")].latency_count == 0  # a direct call: nothing in between
        assert edges[("b", "c", "in_process")].latency_count == 2  # first chunk sent -> receiver started
        assert recorder.collect() is None  # deltas: nothing new since

        done = next(f for f in runtime.links.sent[SINK] if f.WhichOneof("body") == "done")
        items = timing_tuples(done.done.timings)
        timings = request_timings(
            items,
            started=min(t[1] for t in items if t[1]),
            ended=max(t[2] for t in items),
            first_audio=None,
            stage_groups={"a": "g", "b": "g", "c": "g"},
        )
        assert [s.stage for s in timings.stages] == ["a", "b", "c"]
        assert all(s.duration_seconds >= 0 for s in timings.stages)
        assert {(h.src, h.dst, h.transport) for h in timings.handoffs} == {
            ("a", "b", "in_process"),
            ("b", "c", "in_process"),
        }
        stream_source = next(s for s in timings.stages if s.stage == "b")
        assert stream_source.duration_seconds > 0  # closed although its receiver started before it returned
        text = format_waterfall(timings)
        assert "a (g)" in text and "handoff b -> c via in_process" in text

    asyncio.run(scenario())


def test_an_in_process_stream_counts_its_chunks():
    """stagevisor_edge_chunks_total{transport="in_process"} stayed 0 however many chunks a stage streamed to another
    stage of its own process: only chunks arriving over a link were counted."""

    async def scenario():
        runtime, recorder = recording_runtime(
            [planned("b", next=["c"], stream_to=["c"]), planned("c")], {"b": Streamer(), "c": Drain()}
        )
        for request_id in ("r1", "r2"):
            submit(runtime, "b", request_id=request_id)
        assert await poll_until(lambda: runtime.links.bodies(SINK).count("done") == 2)
        edges = {(e.src, e.dst, e.transport): e for e in recorder.collect().edges}
        assert edges[("b", "c", "in_process")].chunks == 6  # three chunks per request

    asyncio.run(scenario())


class Gate:
    """Holds a request whose data says `wait` until the test opens its event."""

    def __init__(self):
        self.events, self.entered = {}, 0

    async def process(self, payload, ctx):
        if payload.data.get("wait"):
            self.entered += 1
            await self.events.setdefault(payload.request_id, asyncio.Event()).wait()
        return dict(payload.data)


class FailOn:
    async def process(self, payload, ctx):
        if payload.data.get("fail"):
            raise RuntimeError("asked to fail")
        return dict(payload.data)


def by_stage(report):
    return {s.stage: s for s in report.stages} if report is not None else {}


def by_edge(report):
    return {(e.src, e.dst): e.handoffs for e in report.edges if e.transport == "in_process"} if report else {}


def test_untimed_direct_calls_and_handoffs_are_counted_exactly_when_a_report_is_taken():
    """1. r1 runs a -> b -> c; r2 and r4 wait inside b; r3 fails in c. No chain is timed.
    2. A report counts finished calls, running calls and handoffs of each direct edge exactly.
    3. r4 is cancelled, r2 goes on: the next report adds only what happened since (deltas)."""

    async def scenario():
        gate = Gate()
        runtime, recorder = recording_runtime(
            [planned("a", next=["b"]), planned("b", next=["c"]), planned("c")],
            {"a": Echo(), "b": gate, "c": FailOn()},
            timed_per_report=0,
        )
        for request_id, data in (("r1", {}), ("r2", {"wait": 1}), ("r3", {"fail": 1}), ("r4", {"wait": 1})):
            submit(runtime, "a", request_id=request_id, data=data)
        assert await poll_until(lambda: gate.entered == 2 and len(runtime.links.sent.get(SINK, [])) == 2)
        report = recorder.collect()
        stages = by_stage(report)
        assert {n: (stages[n].calls, stages[n].in_flight) for n in "abc"} == {"a": (4, 0), "b": (2, 2), "c": (2, 0)}
        assert stages["c"].failures == 1 and all(stages[n].count == 0 and not stages[n].buckets for n in "abc")
        assert by_edge(report) == {("a", "b"): 4, ("b", "c"): 2}

        runtime.cancel("r4")
        gate.events["r2"].set()
        assert await poll_until(lambda: runtime.in_flight() == 0)
        report = recorder.collect()
        stages = by_stage(report)
        assert {n: (stages[n].calls, stages[n].in_flight) for n in "bc"} == {"b": (2, 0), "c": (1, 0)}
        assert "a" not in stages and stages["c"].failures == 0
        assert by_edge(report) == {("b", "c"): 1}  # r2 only: the cancelled call handed nothing on
        assert recorder.collect() is None

    asyncio.run(scenario())


def test_stage_timing_is_an_even_sample_above_the_budget_while_calls_stay_exact():
    async def run(runtime, first, count):
        for index in range(first, first + count):
            submit(runtime, "a", request_id=f"r{index}")
        assert await poll_until(lambda: runtime.links.bodies(SINK).count("done") == first + count)

    async def scenario():
        runtime, recorder = recording_runtime(
            [planned("a", next=["b"]), planned("b")], {"a": Echo(), "b": Echo()}, timed_per_report=4
        )
        await run(runtime, 0, 20)
        stages = by_stage(recorder.collect())
        assert (stages["a"].calls, stages["a"].count, stages["b"].calls, stages["b"].count) == (20, 4, 20, 4)
        await run(runtime, 20, 20)  # 20 chains in the last interval: one in every 5 is timed
        report = recorder.collect()
        stages = by_stage(report)
        assert (stages["a"].calls, stages["a"].count, sum(stages["a"].buckets)) == (20, 4, 4)
        assert by_edge(report) == {("a", "b"): 20}
        submit(runtime, "a", request_id="read", request={"text": "hi", "options": {}, "timings": True})
        assert await poll_until(lambda: runtime.links.bodies(SINK).count("done") == 41)
        assert by_stage(recorder.collect())["a"].count == 1  # a request whose timings are read is timed

    asyncio.run(scenario())


def test_cross_process_handoff_is_counted_once_with_its_bytes_and_latency_by_the_receiver():
    async def scenario():
        sender, _ = recording_runtime(
            [planned("a", next=["b"]), planned("b")], {"a": Echo()}, routes={"b": "unix:/b.sock"}, group="g1"
        )
        receiver, recorder = recording_runtime([planned("b")], {"b": Echo()}, group="g2")
        submit(sender, "a", data={"x": 1})
        assert await poll_until(lambda: sender.links.sent.get("unix:/b.sock"))
        frame = sender.links.sent["unix:/b.sock"][0]
        assert "a" in frame.submit.timings.names  # the sender's span rides with the request
        receiver.on_frame(frame, inbound_link)
        assert await poll_until(lambda: receiver.links.bodies(SINK) == ["done"])
        edge = next(e for e in recorder.collect().edges if (e.src, e.dst) == ("a", "b"))
        assert (edge.transport, edge.handoffs, edge.latency_count) == ("grpc", 1, 1)
        assert edge.bytes >= frame.ByteSize() > 0

    asyncio.run(scenario())


def test_without_a_recorder_the_trace_holds_only_hops_and_done_has_no_timings():
    async def scenario():
        runtime = StageRuntime(
            {s.name: s for s in (planned("a", next=["b"]), planned("b"))},
            {"a": Echo(), "b": Echo()},
            {},
            SINK,
            "g",
            Codec(),
        )
        runtime.links = RecordedLinks()
        submit(runtime, "a")
        assert await poll_until(lambda: runtime.links.bodies(SINK) == ["done"])
        done = runtime.links.sent[SINK][0].done
        assert len(done.trace) == 1 and not done.HasField("timings")

    asyncio.run(scenario())


# ---- the daemon side -------------------------------------------------------------------


def test_worker_deltas_accumulate_across_a_worker_restart_without_reset_or_double_count():
    pids = {"g2": 11}
    metrics = DaemonMetrics(
        "m", {"c": "g2"}, groups=lambda: [{"name": "g2", "state": "READY", "pid": pids["g2"], "restarts": 0}]
    )
    metrics.apply_report(report(11, 3, 3, in_flight=2, calls=6))  # 6 calls, 3 of them timed
    pids["g2"] = 12  # the worker was replaced; the new one reports from zero
    metrics.apply_report(report(12, 2, 2, calls=4))
    samples = parse(metrics.registry)
    assert samples[("stagevisor_stage_processing_seconds_count", frozenset({("stage", "c"), ("group", "g2")}))] == 5
    assert samples[("stagevisor_stage_calls_total", frozenset({("stage", "c"), ("group", "g2")}))] == 10
    edge = frozenset({("src", "b"), ("dst", "c"), ("transport", "grpc")})
    assert samples[("stagevisor_edge_handoffs_total", edge)] == 5
    assert samples[("stagevisor_edge_bytes_total", edge)] == 500
    assert samples[("stagevisor_edge_handoff_latency_seconds_count", edge)] == 5
    assert samples[("stagevisor_stage_in_flight", frozenset({("stage", "c"), ("group", "g2")}))] == 0
    assert samples[("stagevisor_group_state", frozenset({("group", "g2"), ("state", "READY")}))] == 1
    assert metrics.stage_window("c")[0] == 10  # every call, timed or not


def test_a_stage_an_apply_moved_keeps_its_old_group_s_series_and_counts_only_its_new_calls_in_the_new_one():
    """Before: the series of a stage took the group running it at scrape time, so after an apply merged group g2
    into g1 the stage's whole count moved to `{group="g1"}` and `{group="g2"}` vanished; applied back, g2's
    series returned with g1's calls in it."""
    metrics = DaemonMetrics("m", {"c": "g2"})
    metrics.apply_report(report(11, 3, 0, in_flight=1))
    metrics.stage_groups = {"c": "g1"}  # an apply merged g2 into g1
    moved = report(12, 2, 0, in_flight=1)
    moved.group = "g1/0"  # a replica of the new group: counted as its group's
    metrics.apply_report(moved)
    samples = parse(metrics.registry)

    def sample(name, group):
        return samples[(name, frozenset({("stage", "c"), ("group", group)}))]

    assert sample("stagevisor_stage_calls_total", "g2") == 3 and sample("stagevisor_stage_calls_total", "g1") == 2
    assert sample("stagevisor_stage_processing_seconds_count", "g1") == 2
    assert sample("stagevisor_stage_in_flight", "g2") == 0  # no worker runs it there now
    assert metrics.stage_window("c")[0] == 5  # `top` and the autoscaler read the stage across its groups


def test_stale_in_flight_of_a_dead_worker_is_not_reported():
    metrics = DaemonMetrics("m", {"c": "g2"})
    metrics.apply_report(report(11, 0, 0, in_flight=4))
    assert metrics.stage_in_flight("c", {"g2": 11}) == 4
    assert metrics.stage_in_flight("c", {"g2": 0}) == 0


def reported_in_flight(*workers: tuple[str, int, int]) -> DaemonMetrics:
    """Metrics that took one report of stage c's in-flight calls from each (worker name, pid, calls)."""
    metrics = DaemonMetrics("m", {"c": "g2"})
    for worker, pid, running in workers:
        message = report(pid, 0, 0, in_flight=running)
        message.group = worker
        metrics.apply_report(message)
    return metrics


def test_in_flight_of_replicas_adds_up_and_a_replaced_one_no_longer_counts():
    metrics = reported_in_flight(("g2/0", 21, 2), ("g2/1", 22, 3))
    assert metrics.stage_in_flight("c", {"g2/0": 21, "g2/1": 22}) == 5
    assert metrics.stage_in_flight("c", {"g2/0": 21, "g2/1": 23}) == 2  # g2/1 was replaced since


def test_a_worker_a_scale_renamed_still_counts_under_the_name_it_reports():
    """Before: after a scale from one worker to two, the first one (tracked as `g2/0`) still reported as `g2`, and
    its requests counted nowhere: in_flight, `top` and the autoscaler read 0 for it, and the autoscaler removed a
    replica under load, then added it again."""
    metrics = reported_in_flight(("g2", 21, 3), ("g2/1", 22, 2))
    assert metrics.stage_in_flight("c", {"g2/0": 21, "g2/1": 22}) == 5
    assert metrics.worker_in_flight("g2/0", 21) == 3


def test_an_old_workers_stop_report_during_an_apply_does_not_stand_for_its_successors():
    """While an apply switches, the old topology's `g2` (pid 21) and the new one's (pid 31) both report as `g2`: the
    old one's last report as it stopped (0 in flight) replaced the new one's, and the stage read 0 in flight
    (`top`, the autoscaler) until the new worker's next report."""
    metrics = reported_in_flight(("g2", 31, 3), ("g2", 21, 0))
    assert metrics.stage_in_flight("c", {"g2": 31}) == 3
    assert metrics.worker_in_flight("g2", 31) == 3


def test_in_flight_keeps_a_bounded_number_of_reporting_workers():
    from stagevisor.supervisor.metrics.totals import IN_FLIGHT_KEPT

    others = [(f"g2/{pid}", pid, 1) for pid in range(2, IN_FLIGHT_KEPT + 11)]
    metrics = reported_in_flight(("g2", 1, 2), *others[:900], ("g2", 1, 2), *others[900:])
    # g2 (pid 1) reported first and again later: it stays, and those reported longest ago go
    assert len(metrics.stages["c"].in_flight) == IN_FLIGHT_KEPT
    assert metrics.stage_in_flight("c", {"g2": 1, "g2/2": 2, "g2/12": 12}) == 3


def test_request_meter_observes_latency_first_audio_rtf_and_gaps_by_outcome():
    metrics = DaemonMetrics("demo", {})
    meter = metrics.start_request()
    meter.audio(22050, 22050)
    meter.audio(22050, 22050)
    meter.finish("OK")
    metrics.start_request().finish("INVALID_ARGUMENT")
    samples = parse(metrics.registry)
    model = ("model", "demo")
    assert samples[("stagevisor_requests_total", frozenset({model, ("outcome", "success"), ("code", "OK")}))] == 1
    assert (
        samples[("stagevisor_requests_total", frozenset({model, ("outcome", "error"), ("code", "INVALID_ARGUMENT")}))]
        == 1
    )
    for name in (
        "stagevisor_time_to_first_audio_seconds_count",
        "stagevisor_real_time_factor_count",
        "stagevisor_audio_chunk_gap_seconds_count",
        "stagevisor_request_duration_seconds_count",
    ):
        assert samples[(name, frozenset({model}))] == 1, name
    assert samples[("stagevisor_audio_seconds_total", frozenset({model}))] == 2.0
    assert samples[("stagevisor_requests_in_flight", frozenset({model}))] == 0


def test_request_meter_observes_how_long_playback_from_the_first_chunk_would_have_paused(monkeypatch):
    from stagevisor.supervisor.metrics import registry

    now = [100.0]
    monkeypatch.setattr(registry.time, "monotonic", lambda: now[0])
    metrics = DaemonMetrics("demo", {})
    for arrivals in (
        [(100.2, 1.0), (100.9, 1.0), (101.5, 0.5)],  # always ahead: no pause
        [(100.2, 1.0), (101.7, 1.0), (102.9, 0.5)],
    ):  # 0.5 s and then 0.2 s without audio
        now[0] = 100.0
        meter = metrics.start_request()
        for at, seconds in arrivals:
            now[0] = at
            meter.audio(int(seconds * 22050), 22050)
        meter.finish("OK")
    failed = metrics.start_request()
    now[0] = 110.0
    failed.audio(22050, 22050)
    failed.finish("INTERNAL")  # a failed request's pauses are not the stream's
    samples = parse(metrics.registry)
    model = ("model", "demo")
    assert samples[("stagevisor_playback_stall_seconds_count", frozenset({model}))] == 2
    assert samples[("stagevisor_playback_stall_seconds_sum", frozenset({model}))] == pytest.approx(0.7)
    assert samples[("stagevisor_playback_stall_seconds_bucket", frozenset({model, ("le", "0.0")}))] == 1


# ---- resources and budgets -------------------------------------------------------------


def test_sizes_and_rss_budgets_parse_or_say_what_is_wrong():
    assert parse_size("512M") == 512 << 20 and parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size("1048576") == 1 << 20
    assert parse_rss_budgets(["g=2G"], ["g"]) == {"g": 2 << 30}
    with pytest.raises(ValueError, match="no process group 'x'"):
        parse_rss_budgets(["x=1G"], ["g"])
    with pytest.raises(ValueError, match="malformed"):
        parse_rss_budgets(["g"], ["g"])
    with pytest.raises(ValueError, match="malformed"):
        parse_size("lots")
    with pytest.raises(ValueError, match="malformed"):
        parse_size("\u0661\u0662M")  # Arabic-Indic digits: a size is written in ASCII digits


def cpu_plan() -> Plan:
    stage = PlannedStage("s", "g", 0, 1, 0.5, "declared", "m:f")
    return Plan(
        model="m",
        model_path=None,
        changed=False,
        stages=(stage,),
        groups=(ProcessGroup("g", ("s",), 0, 0.5),),
        edges=(),
        gpus=(GpuBudget(0, 0.5, 1.0, ("g",)),),
    )


def test_rss_over_budget_is_flagged_once_and_gpu_memory_is_na_without_nvml():
    sampler = ResourceSampler(cpu_plan(), {"g": 1 << 20}, gpu_probe=GpuProbe())
    changes = sampler.sample({"g": os.getpid()})
    assert [(subject, over) for subject, over, _ in changes] == [("g", True)]
    usage = sampler.usage["g"]
    assert usage.over_budget and usage.rss_bytes > 1 << 20 and usage.threads >= 1 and usage.open_fds > 0
    assert usage.gpu_memory_bytes is None and usage.budget_kind == "rss"
    assert sampler.sample({"g": os.getpid()}) == []  # still over: no second warning
    assert "--rss-budget" in sampler.warnings()[0]


def test_cpu_seconds_keep_what_a_replaced_worker_used():
    sampler = ResourceSampler(cpu_plan(), gpu_probe=GpuProbe())
    sampler.sample({"g": os.getpid()})
    before = sampler.usage["g"].cpu_seconds
    assert before > 0
    sampler.sample({"g": 0})  # the worker is gone
    assert sampler.usage["g"].cpu_seconds >= before and sampler.usage["g"].rss_bytes == 0


# ---- what operators read -----------------------------------------------------------------


def test_top_view_lists_every_group_and_stage_with_na_for_unmeasured_gpu_memory():
    resources = {
        "rss_bytes": 60 << 20,
        "cpu_seconds": 1.0,
        "cpu_percent": 12.5,
        "threads": 4,
        "open_fds": 9,
        "gpu_memory_bytes": None,
        "memory_budget_bytes": 50 << 20,
        "budget_kind": "rss",
        "over_budget": True,
    }
    data = {
        "state": "SERVING",
        "window_seconds": 60.0,
        "in_flight": 1,
        "warnings": ["group 'g1' is over"],
        "groups": [
            {"name": "g1", "state": "READY", "pid": 10, "restarts": 0, "in_flight": 1, "resources": resources},
            {"name": "g2", "state": "BACKOFF", "pid": 0, "restarts": 1, "in_flight": 0, "resources": None},
            {"name": "g3", "state": "BACKOFF", "pid": 0, "restarts": 1, "in_flight": 0, "resources": resources},
        ],
        "stages": [{"name": "a", "group": "g1", "in_flight": 1, "count": 7, "p50_seconds": 0.002, "p99_seconds": 0.01}],
    }
    lines = render(SummaryReport.from_json(data))
    text = "\n".join(lines)
    assert lines[0].startswith("stagevisor top - daemon SERVING, 1 request in flight, ")  # it read `1 requests`
    # g3 has no process: its last sample is not shown as what it uses now
    [g3] = [line for line in lines if line.startswith("g3 ")]
    assert g3.split()[3:6] == ["-", "-", "-"] and "MiB" in g3  # CPU%, RSS, GPU MEM; its budget stays
    assert "g1" in text and "g2" in text and "OVER BUDGET" in text and "n/a" in text
    assert "2.0 ms" in text and "10.0 ms" in text and "warning: group 'g1' is over" in text
    # The percentiles say where they come from (issue: P50 1750 ms where --timings said 1196 ms).
    assert "P50*" in text and "* estimated from histogram buckets" in text and "--timings" in text


def test_budget_events_print_as_warnings_and_status_lists_them():
    event = ConditionEvent("g1", GroupState.READY, GroupState.READY, 10, "group 'g1' uses too much", 0.0)
    from stagevisor.supervisor._proto import admin_pb2

    message = admin_pb2.LifecycleEvent(
        group=event.group, old_state="READY", new_state="READY", pid=10, reason=event.reason, time=0.0, kind=event.kind
    )
    assert format_event(message).endswith("g1: WARNING group 'g1' uses too much")
    applied = admin_pb2.LifecycleEvent(reason="applied: changed vocoder", time=0.0, kind="APPLIED")
    assert format_event(applied)[8:] == " APPLIED applied: changed vocoder"  # the daemon's: no group (was " : ")
    # Its JSON line had states no group was in (READY -> READY): none now; a group's condition keeps its state.
    assert (event_json(applied, False)["old_state"], event_json(applied, False)["new_state"]) == (None, None)
    assert (event_json(message, True)["new_state"], event_json(message, True)["replayed"]) == ("READY", True)
    status = {
        "state": "SERVING",
        "pid": 1,
        "uptime_seconds": 1.0,
        "groups_ready": 1,
        "groups_total": 1,
        "in_flight": 0,
        "root_cause": None,
        "warnings": ["group 'g1' uses too much"],
        "metrics_url": "",
        "groups": [{"name": "g1", "state": "READY", "pid": 10, "restarts": 0, "resources": None}],
    }
    assert "warning: group 'g1' uses too much" in format_status(StatusReport.from_json(status))


def test_otlp_export_is_off_unless_the_standard_variables_ask_for_it():
    assert not otlp_configured({})
    assert otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not otlp_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "console"})
    assert otlp_configured(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces", "OTEL_TRACES_EXPORTER": "console, otlp"}
    )
    assert SpanExporter.from_env({}) is None


def test_timings_become_one_trace_of_stage_and_handoff_spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stagevisor.supervisor._proto import synthesis_pb2 as spb

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    timings = spb.RequestTimings(total_seconds=0.5, first_audio_seconds=0.1)
    timings.stages.add(stage="a", group="g", start_seconds=0.0, duration_seconds=0.2)
    timings.handoffs.add(src="a", dst="b", transport="grpc", start_seconds=0.2, latency_seconds=0.001)
    SpanExporter(provider.get_tracer("test")).export(timings, started=100.0, model="m", code="OK")
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert set(spans) == {"synthesize", "stage a", "handoff a -> b"}
    root = spans["synthesize"]
    assert spans["stage a"].parent.span_id == root.context.span_id
    assert spans["stage a"].end_time - spans["stage a"].start_time == pytest.approx(0.2e9, rel=1e-3)
    assert root.status.is_ok and root.attributes["rpc.grpc.status_code"] == 0


def test_a_failed_request_exports_its_root_span_with_an_error_status():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    metrics = DaemonMetrics("m", {"a": "g"}, spans=SpanExporter(provider.get_tracer("test")))
    meter = metrics.start_request()
    assert meter.exports_spans
    meter.attach(type("Handle", (), {"request_id": "req-1", "timings": []})())
    meter.finish("UNAVAILABLE")
    (root,) = memory.get_finished_spans()
    assert root.name == "synthesize" and root.status.status_code is StatusCode.ERROR
    assert root.attributes["stagevisor.request_id"] == "req-1" and root.attributes["rpc.grpc.status_code"] == 14


# ---- docs and dashboard stay in step with the code ------------------------------------------


def exported_families() -> set[str]:
    """Every family name a daemon with one of everything exports (counters without `_total`)."""

    metrics = DaemonMetrics(
        "m",
        {"c": "g2"},
        groups=lambda: [
            {
                "name": "g2",
                "gpu": 0,
                "state": "READY",
                "pid": 11,
                "restarts": 0,
                "resources": {
                    "rss_bytes": 1,
                    "cpu_seconds": 1.0,
                    "cpu_percent": 1.0,
                    "threads": 1,
                    "open_fds": 1,
                    "gpu_memory_bytes": 1,
                    "memory_budget_bytes": 2,
                    "budget_kind": "gpu_fraction",
                    "over_budget": False,
                },
            }
        ],
        gpus=lambda: [{"id": 0, "limit": 1.0, "total_bytes": 10, "measured_bytes": 1, "over_limit": False}],
    )
    metrics.apply_report(report(11, 1, 1))
    from stagevisor.supervisor.dataplane.admission import Admission

    metrics.admission = Admission()
    metrics.admission.reject("BUSY")
    text = generate_latest(metrics.registry).decode()
    return {f.name for f in text_string_to_metric_families(text)}


def test_every_metric_is_documented_and_the_dashboard_uses_only_real_ones():
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    families = exported_families()
    assert len(families) >= 28
    readme = (root / "deploy" / "README.md").read_text()
    documented = set(re.findall(r"`(stagevisor_[a-z_]+)`", readme))
    names = {f"{f}_total" if f"{f}_total" in documented else f for f in families}
    assert names <= documented, f"undocumented: {sorted(names - documented)}"
    dashboard = json.loads((root / "deploy" / "grafana" / "stagevisor-dashboard.json").read_text())
    used = {
        m
        for panel in dashboard["panels"]
        for t in panel.get("targets", [])
        for m in re.findall(r"stagevisor_[a-z_]+", t["expr"])
    }
    base = {re.sub(r"_(bucket|total)$", "", m) for m in used}
    assert base <= families, f"dashboard queries unknown metrics: {sorted(base - families)}"


class FakeNvml:
    """The few pynvml calls GpuProbe makes, over a made-up GPU 0 of 100 MiB."""

    def __init__(self, used: dict[int, int]) -> None:
        self.used = used

    def nvmlDeviceGetHandleByIndex(self, index):
        assert index == 0
        return "gpu0"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return type("Memory", (), {"total": 100 << 20})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [type("Proc", (), {"pid": pid, "usedGpuMemory": used})() for pid, used in self.used.items()]


def test_gpu_group_over_its_declared_fraction_and_the_gpu_over_its_limit_are_flagged():
    probe = GpuProbe(FakeNvml({os.getpid(): 60 << 20}))
    sampler = ResourceSampler(cpu_plan(), gpu_probe=probe)  # group g: fraction 0.5 of GPU 0
    changes = {subject: over for subject, over, _ in sampler.sample({"g": os.getpid()})}
    usage = sampler.usage["g"]
    assert (usage.gpu_memory_bytes, usage.memory_budget_bytes, usage.budget_kind) == (
        60 << 20,
        50 << 20,
        "gpu_fraction",
    )
    assert changes == {"g": True}  # 60 MiB > 0.5 x 100 MiB; the GPU (limit 1.0) is fine
    assert sampler.gpus[0] == {"total_bytes": 100 << 20, "measured_bytes": 60 << 20, "over_limit": False}
    probe.nvml.used[os.getpid()] = 120 << 20
    changes = {subject: over for subject, over, _ in sampler.sample({"g": os.getpid()})}
    assert changes == {"gpu:0": True}
    probe.nvml.used[os.getpid()] = 10 << 20
    changes = {subject: over for subject, over, _ in sampler.sample({"g": os.getpid()})}
    assert changes == {"g": False, "gpu:0": False}


class FailingNvml(FakeNvml):
    """A driver that stops answering: every device call raises, as pynvml's NVMLError does."""

    def nvmlDeviceGetHandleByIndex(self, index):
        raise RuntimeError("GPU is lost")


def test_an_nvml_failure_is_logged_once_as_a_warning_then_at_debug(caplog):
    """NVML's errors gave None with no reason logged: a GPU whose figures read n/a said nothing of why."""
    probe = GpuProbe(FailingNvml({}))
    with caplog.at_level(logging.DEBUG, logger="stagevisor.resources"):
        for _ in range(3):
            assert probe.total_bytes(0) is None and probe.used_by_pid(0) is None
    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert records[:2] == [
        (logging.WARNING, "NVML cannot tell the total memory of GPU 0 (RuntimeError: GPU is lost): shown as n/a"),
        (
            logging.WARNING,
            "NVML cannot tell the memory used by each process of GPU 0 (RuntimeError: GPU is lost): shown as n/a",
        ),
    ]
    assert [level for level, _ in records[2:]] == [logging.DEBUG] * 4
