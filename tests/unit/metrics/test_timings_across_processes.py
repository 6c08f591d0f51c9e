"""Request timings when a request's trace crosses a process boundary while a stage upstream still runs: the stage's
span leaves open, and the stage's real end must reach the report (or the report must say it is unknown)."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.dataplane.trace import timing_tuples
from stagevisor.supervisor.metrics.recorder import Recorder
from stagevisor.supervisor.metrics.timings import format_waterfall, request_timings
from tests.fakes import RecordedLinks, poll_until
from tests.unit.dataplane.runtime_driver import SINK, inbound_link, planned, submit

VOCODER = "unix:/vocoder.sock"
TIMED = {"text": "hi", "options": {}, "timings": True}


def recording_runtime(stages, executors, routes=None, group="g"):
    runtime = StageRuntime(
        {s.name: s for s in stages}, executors, routes or {}, SINK, group, Codec(), recorder=Recorder(group, pid=1)
    )
    runtime.links = RecordedLinks()
    return runtime


class Preprocess:
    """Streams its first sentence, then works on until the engine has opened its stream to the vocoder."""

    def __init__(self) -> None:
        self.engine_streamed = asyncio.Event()

    async def process(self, payload, ctx):
        await ctx.stream({"sentence": 0})
        await self.engine_streamed.wait()
        return {}


class Engine:
    def __init__(self, streamed: asyncio.Event) -> None:
        self.streamed = streamed

    async def process(self, payload, ctx):
        async for chunk in ctx.chunks():
            await ctx.stream(chunk)
            self.streamed.set()
        return {}


class Drain:
    async def process(self, payload, ctx):
        return {"got": [c async for c in ctx.chunks()]}


def stage_spans(done):
    return {name: (start, end) for name, start, end in timing_tuples(done.timings) if "\x1f" not in name}


def test_an_upstream_stage_running_when_the_trace_left_its_process_reports_its_real_end():
    """1. preprocessing streams to tts_engine in its process; tts_engine streams to the vocoder in another one.
    2. tts_engine opens its stream to the vocoder while preprocessing still runs: the opening carries
       preprocessing's span open (end 0).
    3. preprocessing returns, then tts_engine; the stream's end marker reaches the vocoder's worker.
    4. The vocoder's Done carries preprocessing's real end, so its duration is not the request's."""

    async def scenario():
        preprocess = Preprocess()
        sender = recording_runtime(
            [planned("preprocessing", stream_to=["tts_engine"]), planned("tts_engine", stream_to=["vocoder"])],
            {"preprocessing": preprocess, "tts_engine": Engine(preprocess.engine_streamed)},
            routes={"vocoder": VOCODER},
        )
        receiver = recording_runtime([planned("vocoder")], {"vocoder": Drain()}, group="vocoder")
        submit(sender, "preprocessing", request=TIMED)
        assert await poll_until(lambda: sender.links.bodies(VOCODER) == ["chunk", "end"])
        opening = sender.links.sent[VOCODER][0].chunk.opening
        assert ("preprocessing", 0.0) in [(n, e) for n, _, e in timing_tuples(opening.timings)]  # left open
        for frame in sender.links.sent[VOCODER]:
            receiver.on_frame(frame, inbound_link)
        assert await poll_until(lambda: receiver.links.bodies(SINK) == ["done"])
        spans = stage_spans(receiver.links.sent[SINK][0].done)

        start, end = spans["preprocessing"]
        assert 0 < start < end <= spans["tts_engine"][1] <= spans["vocoder"][1]
        later = spans["vocoder"][1] + 10.0  # the request ends well after every stage
        timings = request_timings(timing_tuples(receiver.links.sent[SINK][0].done.timings), start, later, None, {})
        reported = {s.stage: s for s in timings.stages}["preprocessing"]
        assert not reported.end_unknown
        assert reported.duration_seconds == end - start < 10.0

    asyncio.run(scenario())


def test_a_stage_whose_end_never_arrived_is_reported_as_unknown_not_as_running_to_the_request_end():
    items = [("a", 100.0, 100.01), ("b", 100.002, 0.0), ("c", 100.004, 100.09)]
    timings = request_timings(items, 100.0, 100.1, None, {"a": "g", "b": "g", "c": "v"})
    by_stage = {s.stage: s for s in timings.stages}
    assert by_stage["b"].end_unknown and by_stage["b"].duration_seconds == 0.0
    assert not by_stage["a"].end_unknown and not by_stage["c"].end_unknown
    text = format_waterfall(timings)
    line = next(row for row in text.splitlines() if row.startswith("b (g)"))
    assert "start 2.0 ms, end unknown" in line and "took" not in line


def test_a_branch_that_knows_a_stage_end_wins_over_one_that_saw_it_open():
    items = [("a", 100.0, 0.0), ("a", 100.0, 100.01), ("b", 100.002, 100.05)]
    timings = request_timings(items, 100.0, 100.1, None, {})
    (a,) = [s for s in timings.stages if s.stage == "a"]
    assert not a.end_unknown and abs(a.duration_seconds - 0.01) < 1e-9


def test_an_exported_stage_whose_end_is_unknown_is_an_instant_span_that_says_so():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from stagevisor.supervisor.metrics.timings import SpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    timings = spb.RequestTimings(total_seconds=0.5)
    timings.stages.add(stage="a", group="g", start_seconds=0.1, end_unknown=True)
    SpanExporter(provider.get_tracer("test")).export(timings, started=100.0, model="m", code="OK")
    span = next(s for s in memory.get_finished_spans() if s.name == "stage a")
    assert span.end_time == span.start_time and span.attributes["stagevisor.end_unknown"] is True
