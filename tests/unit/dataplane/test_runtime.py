"""StageRuntime without processes or sockets: in-process direct calls, streams, backpressure, failures."""

import asyncio
import gc
import sys
import threading

import numpy as np
import pytest

from stagevisor.stages.base import InvalidRequest, StageError, StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.invocation import Invocation
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.dataplane.streams import STREAM_WINDOW
from stagevisor.supervisor.dataplane.trace import flatten, parse_hop
from tests.fakes import CountingBufferSource, RecordedLinks, poll_until
from tests.unit.dataplane.runtime_driver import SINK, Record, inbound_link, make_runtime, planned, submit


def test_in_process_next_edge_hands_over_the_same_objects_unencoded():
    """An unpicklable lock and the data dict itself reach the next stage: nothing was serialized."""

    async def scenario():
        lock = threading.Lock()
        produced = {"lock": lock, "array": np.zeros(3)}
        consumer = Record()
        runtime = make_runtime([planned("a", next=["b"]), planned("b")], {"a": Record(produced), "b": consumer})
        submit(runtime, "a")
        assert await poll_until(lambda: consumer.payloads)
        received = consumer.payloads[0].data
        assert received is produced and received["lock"] is lock

    asyncio.run(scenario())


def test_in_process_stream_delivers_the_same_chunk_objects_in_order_then_final_data():
    chunks = [{"i": i, "obj": object()} for i in range(20)]

    class Producer:
        async def process(self, payload, ctx):
            for chunk in chunks:
                await ctx.stream(chunk)
            return {"final": True}

    class Consumer:
        def __init__(self):
            self.got, self.final = [], None

        async def process(self, payload, ctx):
            self.got = [c async for c in ctx.chunks()]
            self.final = dict(payload.data)

    async def scenario():
        consumer = Consumer()
        runtime = make_runtime(
            [planned("a", next=["b"], stream_to=["b"]), planned("b")], {"a": Producer(), "b": consumer}
        )
        submit(runtime, "a")
        assert await poll_until(lambda: consumer.final is not None)
        assert all(g is c for g, c in zip(consumer.got, chunks, strict=False)) and len(consumer.got) == len(chunks)
        assert consumer.final == {"final": True}

    asyncio.run(scenario())


def test_a_chunk_streamed_after_the_stage_returned_is_refused_and_does_not_start_its_receiver_again():
    """A stage leaves a task that streams once process() has returned: the stream opened again and
    its in-process receiver ran a second time for a request already done. The late ctx.stream() raises."""
    late: list[BaseException] = []

    class Leaky:
        async def process(self, payload, ctx):
            await ctx.stream({"i": 0})

            async def later():
                await asyncio.sleep(0.01)
                try:
                    await ctx.stream({"i": "late"})
                except RuntimeError as error:
                    late.append(error)

            asyncio.ensure_future(later())
            return {"final": True}

    class Consumer:
        def __init__(self):
            self.calls, self.chunks = 0, []

        async def process(self, payload, ctx):
            self.calls += 1
            async for chunk in ctx.chunks():
                self.chunks.append(chunk)

    async def scenario():
        consumer = Consumer()
        runtime = make_runtime([planned("a", next=["b"], stream_to=["b"]), planned("b")], {"a": Leaky(), "b": consumer})
        submit(runtime, "a")
        assert await poll_until(lambda: late, timeout=10)
        assert "stage 'a' streamed a chunk of request r1 after its process() returned" in str(late[0])
        assert consumer.calls == 1 and consumer.chunks == [{"i": 0}]
        assert runtime.links.bodies(SINK) == ["done"]

    asyncio.run(scenario())


def test_slow_in_process_consumer_bounds_what_its_producer_buffers():
    """The producer may run at most STREAM_WINDOW chunks ahead of a consumer that is not reading."""
    produced = []

    class Producer:
        async def process(self, payload, ctx):
            for i in range(100):
                await ctx.stream(i)
                produced.append(i)

    class Stalled:
        def __init__(self):
            self.release = None
            self.got = []

        async def process(self, payload, ctx):
            await self.release.wait()
            self.got = [c async for c in ctx.chunks()]

    async def scenario():
        stalled = Stalled()
        stalled.release = asyncio.Event()
        runtime = make_runtime(
            [planned("a", next=["b"], stream_to=["b"]), planned("b")], {"a": Producer(), "b": stalled}
        )
        submit(runtime, "a")
        await poll_until(lambda: len(produced) >= STREAM_WINDOW)
        for _ in range(50):
            await asyncio.sleep(0)  # give the producer every chance to run ahead
        assert len(produced) <= STREAM_WINDOW
        stalled.release.set()
        assert await poll_until(lambda: len(stalled.got) == 100)

    asyncio.run(scenario())


def test_terminal_stage_reports_its_route_with_in_process_hops_when_done():
    async def scenario():
        runtime = make_runtime([planned("a", next=["b"]), planned("b")], {"a": Record(), "b": Record()})
        submit(runtime, "a")
        assert await poll_until(lambda: "done" in runtime.links.bodies(SINK))
        done = runtime.links.sent[SINK][-1].done
        assert [parse_hop(h) for h in done.trace] == [("a", "b", "in_process")]

    asyncio.run(scenario())


def test_traces_of_a_direct_chain_name_every_hop_in_order_through_fan_out_streams_and_a_remote_stage():
    """a -> b -> c -> d are direct calls; b also fans out to e (a task); c streams to f; d submits to g elsewhere."""

    class Streams(Record):
        async def process(self, payload, ctx):
            self.payloads.append(payload)
            await ctx.stream({"i": 0})
            return None

    class Sees(Record):  # what a stage's context reports as its trace, mid-chain
        async def process(self, payload, ctx):
            self.payloads.append([parse_hop(h) for h in flatten(ctx.trace)])

    async def scenario():
        b = Sees()
        runtime = make_runtime(
            [
                planned("a", next=["b"]),
                planned("b", next=["e", "c"]),
                planned("c", next=["d"], stream_to=["f"]),
                planned("d", next=["g"]),
                planned("e"),
                planned("f"),
            ],
            {"a": Record(), "b": b, "c": Streams(), "d": Record(), "e": Record(), "f": Record()},
            routes={"g": "unix:/g.sock"},
        )
        for request_id in ("r1", "r2"):  # the second request reuses the prebuilt runs: nothing leaks between them
            submit(runtime, "a", request_id=request_id)
            assert await poll_until(
                lambda request_id=request_id: (
                    len(
                        [
                            f
                            for f in runtime.links.sent.get(SINK, ())
                            if f.request_id == request_id and f.WhichOneof("body") == "done"
                        ]
                    )
                    == 2
                )
            )
            assert await poll_until(
                lambda request_id=request_id: [
                    f for f in runtime.links.sent.get("unix:/g.sock", ()) if f.request_id == request_id
                ]
            )
            done = {
                f.src: [parse_hop(h) for h in f.done.trace]
                for f in runtime.links.sent[SINK]
                if f.request_id == request_id and f.WhichOneof("body") == "done"
            }
            assert done == {
                "e": [("a", "b", "in_process"), ("b", "e", "in_process")],
                "f": [("a", "b", "in_process"), ("b", "c", "in_process"), ("c", "f", "in_process")],
            }
            submit_frame = next(f for f in runtime.links.sent["unix:/g.sock"] if f.request_id == request_id)
            assert [parse_hop(h) for h in submit_frame.submit.trace] == [
                ("a", "b", "in_process"),
                ("b", "c", "in_process"),
                ("c", "d", "in_process"),
                ("d", "g", "grpc"),
            ]
        assert b.payloads == [[("a", "b", "in_process")]] * 2

    asyncio.run(scenario())


def test_a_stage_without_an_executor_here_fails_the_request_naming_it():
    async def scenario():
        runtime = make_runtime([planned("a"), planned("b")], {"a": Record()})
        state = runtime.requests.admit("r1")
        await runtime.calls.run(Invocation(runtime.emitter, state, "b", StagePayload("r1", {"text": "hi"}, {}), None))
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.message == "stage 'b' failed: stage 'b' has no executor in this worker"

    asyncio.run(scenario())


def test_remote_next_stage_gets_a_submit_frame_with_the_encoded_data():
    async def scenario():
        runtime = make_runtime(
            [planned("a", next=["b"])], {"a": Record({"x": np.arange(3)})}, routes={"b": "unix:/b.sock"}
        )
        submit(runtime, "a")
        assert await poll_until(lambda: runtime.links.sent.get("unix:/b.sock"))
        frame = runtime.links.sent["unix:/b.sock"][0]
        data = runtime.codec.decode(frame.submit.data)
        assert frame.dst == "b" and list(data["x"]) == [0, 1, 2]
        assert [parse_hop(h) for h in frame.submit.trace] == [("a", "b", "grpc")]

    asyncio.run(scenario())


def test_remote_stream_waits_for_credits_beyond_the_window():
    sent = []

    class Producer:
        async def process(self, payload, ctx):
            for i in range(STREAM_WINDOW + 5):
                await ctx.stream({"i": i})
                sent.append(i)

    async def scenario():
        runtime = make_runtime(
            [planned("a", next=["b"], stream_to=["b"])], {"a": Producer()}, routes={"b": "unix:/b.sock"}
        )
        submit(runtime, "a")
        await poll_until(lambda: len(sent) >= STREAM_WINDOW)
        for _ in range(50):
            await asyncio.sleep(0)
        assert len(sent) == STREAM_WINDOW
        runtime.on_reply(pb.Frame(request_id="r1", src="a", dst="b", credit=pb.Credit(chunks=5)))
        assert await poll_until(lambda: len(sent) == STREAM_WINDOW + 5)
        assert runtime.links.bodies("unix:/b.sock")[-1] == "end"

    asyncio.run(scenario())


def test_stage_exception_fails_the_request_naming_the_stage():
    class Broken:
        async def process(self, payload, ctx):
            raise ValueError("weights missing")

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Broken()})
        submit(runtime, "vocoder")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK))
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.code == pb.FAILURE_CODE_INTERNAL
        assert failure.message == "stage 'vocoder' failed: weights missing"
        assert failure.client_message == ""  # any other exception's text is for the log only

    asyncio.run(scenario())


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() tells who cancelled from Python 3.11")
def test_a_cancelled_error_the_stage_raises_itself_fails_the_request_instead_of_leaving_it_hanging():
    """A stage whose own helper task was cancelled lets CancelledError out of process(); nobody cancelled
    the request, so without a failure frame the client waited for --pipeline-idle-timeout."""

    class CancelsItself:
        async def process(self, payload, ctx):
            helper = asyncio.ensure_future(asyncio.sleep(3600))
            helper.cancel()
            await helper  # raises CancelledError into process()

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": CancelsItself()})
        submit(runtime, "vocoder")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK), timeout=10)
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.code == pb.FAILURE_CODE_INTERNAL
        assert failure.message == "stage 'vocoder' failed: CancelledError" and failure.client_message == ""
        assert await poll_until(lambda: runtime.in_flight() == 0, timeout=10)

    asyncio.run(scenario())


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ is broken too")


class UnprintableStageError(StageError):
    def __str__(self):
        raise RuntimeError("__str__ is broken too")


class LibraryAbort(BaseException):
    """A library's own BaseException subclass, as some use to unwind."""


@pytest.mark.parametrize(
    "error, named",
    [
        (UnprintableError(), "UnprintableError"),
        (UnprintableStageError(), "UnprintableStageError"),
        (GeneratorExit(), "GeneratorExit"),
        (LibraryAbort("unwound"), "unwound"),
    ],
)
def test_an_exception_that_cannot_be_printed_or_is_no_exception_still_fails_the_request(error, named):
    """A stage raises an exception whose __str__ raises, or a BaseException that is not an Exception:
    the request fails naming the stage. The runner used to raise again while describing it (or let it
    through), which ended the task with no failure frame: the client waited for a timeout."""

    class Raises:
        async def process(self, payload, ctx):
            raise error

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Raises()})
        submit(runtime, "vocoder")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK), timeout=10)
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.code == pb.FAILURE_CODE_INTERNAL and failure.stage == "vocoder"
        assert failure.message == f"stage 'vocoder' failed: {named}"
        assert await poll_until(lambda: runtime.in_flight() == 0, timeout=10)

    asyncio.run(scenario())


@pytest.mark.parametrize("error", [SystemExit(0), KeyboardInterrupt()])
def test_a_stage_that_exits_the_worker_says_so_in_the_log_naming_the_stage_and_request(error, caplog):
    """sys.exit() in a stage ends the worker (crash recovery restarts it); multiprocessing prints nothing for a
    SystemExit, so the operator's log showed only `exited unexpectedly (exit code 0)` with no stage named."""

    class Exits:
        async def process(self, payload, ctx):
            raise error

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Exits()})
        state = runtime.requests.admit("r1")
        with pytest.raises(type(error)):
            await runtime.calls.run(
                Invocation(runtime.emitter, state, "vocoder", StagePayload("r1", {"text": "hi"}, {}), None)
            )

    with caplog.at_level("ERROR", logger="stagevisor.supervisor.dataplane.runtime"):
        asyncio.run(scenario())
    assert f"stage 'vocoder' raised {type(error).__name__} in request r1; the worker exits" in caplog.messages


def test_a_long_exception_text_is_clipped_before_it_crosses_to_the_gateway():
    """The Failure frame goes on the link every request of the worker shares: an exception text past the link's
    message limit would break that link and fail them all, so it is clipped where it is raised."""

    class Verbose:
        async def process(self, payload, ctx):
            raise ValueError("x" * 100_000)

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Verbose()})
        submit(runtime, "vocoder")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK), timeout=10)
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.message.startswith("stage 'vocoder' failed: xxx") and len(failure.message) < 3000
        assert failure.message.endswith("more characters)")

    asyncio.run(scenario())


def test_a_stage_error_sends_its_text_for_the_client_with_the_failure():
    class Refusing:
        async def process(self, payload, ctx):
            raise StageError("the reference clip is too short to clone a voice")

    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Refusing()})
        submit(runtime, "vocoder")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK))
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.code == pb.FAILURE_CODE_INTERNAL
        assert failure.client_message == "the reference clip is too short to clone a voice"
        assert failure.message == "stage 'vocoder' failed: the reference clip is too short to clone a voice"

    asyncio.run(scenario())


def test_invalid_request_from_a_stage_becomes_invalid_argument():
    class Picky:
        async def process(self, payload, ctx):
            raise InvalidRequest("noise_scale must be a number")

    async def scenario():
        runtime = make_runtime([planned("a")], {"a": Picky()})
        submit(runtime, "a")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK))
        failure = runtime.links.sent[SINK][-1].failure
        assert failure.code == pb.FAILURE_CODE_INVALID_ARGUMENT and failure.message == "noise_scale must be a number"

    asyncio.run(scenario())


class Forever:
    """A stage that runs until it is cancelled, recording its calls."""

    def __init__(self):
        self.started = self.cancelled = False
        self.calls = 0
        self.requests = []

    async def process(self, payload, ctx):
        self.calls += 1
        self.requests.append(payload.request_id)
        self.started = True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def test_cancel_frame_cancels_the_running_stage_and_late_frames_are_ignored():
    async def scenario():
        stage = Forever()
        runtime = make_runtime([planned("a")], {"a": stage})
        submit(runtime, "a")
        assert await poll_until(lambda: stage.started)
        runtime.on_frame(pb.Frame(request_id="r1", cancel=pb.Cancel(reason="client")), inbound_link)
        assert await poll_until(lambda: stage.cancelled)
        submit(runtime, "a")  # a late frame of the cancelled request
        submit(runtime, "a", "r2")  # a fresh request behind it: once it runs, the late frame was handled
        assert await poll_until(lambda: stage.calls == 2)
        assert stage.requests == ["r1", "r2"] and runtime.in_flight() == 1
        runtime.on_frame(pb.Frame(request_id="r2", cancel=pb.Cancel(reason="done")), inbound_link)
        assert await poll_until(lambda: runtime.in_flight() == 0)

    asyncio.run(scenario())


def test_other_requests_go_on_when_one_fails():
    class FailsOnBoom:
        async def process(self, payload, ctx):
            if payload.request["text"] == "boom":
                raise RuntimeError("boom")
            return {"ok": True}

    async def scenario():
        runtime = make_runtime([planned("a")], {"a": FailsOnBoom()})
        submit(runtime, "a", "bad", {"text": "boom"})
        submit(runtime, "a", "good", {"text": "fine"})
        assert await poll_until(lambda: len(runtime.links.sent.get(SINK, [])) == 2)
        outcome = {f.request_id: f.WhichOneof("body") for f in runtime.links.sent[SINK]}
        assert outcome == {"bad": "failure", "good": "done"}

    asyncio.run(scenario())


def test_stage_returning_a_non_dict_fails_with_a_clear_message():
    async def scenario():
        runtime = make_runtime([planned("a")], {"a": Record(result=[1, 2])})
        submit(runtime, "a")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK))
        assert "expected a dict or None" in runtime.links.sent[SINK][-1].failure.message

    asyncio.run(scenario())


def test_only_the_first_chunk_of_a_remote_stream_carries_its_opening():
    class Producer:
        async def process(self, payload, ctx):
            for i in range(3):
                await ctx.stream({"i": i})

    async def scenario():
        runtime = make_runtime(
            [planned("a", next=["b"], stream_to=["b"])], {"a": Producer()}, routes={"b": "unix:/b.sock"}
        )
        submit(runtime, "a")
        assert await poll_until(lambda: runtime.links.bodies("unix:/b.sock")[-1:] == ["end"])
        chunks = [f.chunk for f in runtime.links.sent["unix:/b.sock"] if f.WhichOneof("body") == "chunk"]
        assert [c.HasField("opening") for c in chunks] == [True, False, False]

    asyncio.run(scenario())


def test_a_submit_whose_second_buffer_does_not_decode_fails_and_releases_each_buffer_once(tmp_path):
    """A remote submit with two pooled tensors, the second of a framework nobody knows:

    1. the request fails (INTERNAL, naming the framework) and its stage never runs.
    2. the dropped frame and the first tensor's mapping release each buffer once, no buffer twice.
    """
    area = shm.SharedArea.create(tmp_path / "area")
    sender, source = Codec(area=area, shm_threshold=1024), CountingBufferSource()

    async def scenario():
        stage = Record()
        runtime = StageRuntime({"a": planned("a")}, {"a": stage}, {}, SINK, "test", Codec(area=area))
        runtime.links = RecordedLinks()
        frame = pb.Frame(request_id="r1", src="", dst="a")
        sender.encode_into({"text": "hi", "options": {}}, frame.submit.request)
        sender.encode_into({"x": np.zeros(1024, np.float32), "y": np.ones(1024, np.float32)}, frame.submit.data)
        sender.take_out_of_line()
        frame.submit.data.map.values[1].tensor.framework = "jax"
        runtime.on_frame(pb.Frame.FromString(frame.SerializeToString()), source)
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK))
        assert "'jax'" in runtime.links.sent[SINK][-1].failure.message and stage.payloads == []
        return [item.tensor.shared.name for item in frame.submit.data.map.values]

    try:
        names = asyncio.run(scenario())
        gc.collect()
        assert source.releases == {name: 1 for name in names}
    finally:
        sender.close()
        area.remove()


class _Replying(CountingBufferSource):
    """An inbound link's side for a receiver that may reply (credits) and release pooled buffers."""

    peer = "test-peer"
    tcp = False

    def reply(self, frame):
        pass

    def credit(self, stream, chunks=1):
        pass


@pytest.mark.parametrize("body", ["chunk", "end"])
@pytest.mark.parametrize("why", ["cancelled", "stage not served here", "worker draining"])
def test_a_dropped_frame_that_opens_a_stream_releases_the_buffers_of_the_request_it_carries(tmp_path, body, why):
    """A stream's first chunk (or its end, when it has no chunk) carries the request, whose reference audio can
    be a pooled buffer: a receiver that drops the frame hands it back, or the sender's link holds it for good."""
    area = shm.SharedArea.create(tmp_path / "area")
    sender, source = Codec(area=area, shm_threshold=1024), _Replying()

    async def scenario():
        runtime = StageRuntime({"b": planned("b")}, {"b": Record()}, {}, SINK, "test", Codec(area=area))
        runtime.links = RecordedLinks()
        if why == "cancelled":
            runtime.on_frame(pb.Frame(request_id="r1", cancel=pb.Cancel(reason="client")), source)
        elif why == "worker draining":
            await runtime.drain(0.0)
        frame = pb.Frame(request_id="r1", src="a", dst="zz" if why == "stage not served here" else "b")
        message = frame.chunk if body == "chunk" else frame.end
        sender.encode_into({"text": "hi", "reference_audio": bytes(4096), "options": {}}, message.opening.request)
        if body == "chunk":
            sender.encode_into({"audio": np.zeros(8, np.float32)}, frame.chunk.value)
        sender.take_out_of_line()
        shared = [v.shared_raw.name for v in message.opening.request.map.values if v.HasField("shared_raw")]
        assert shared, "the reference audio travels in a pooled buffer"
        runtime.on_frame(pb.Frame.FromString(frame.SerializeToString()), source)
        await asyncio.sleep(0.02)
        await runtime.close()
        return shared

    try:
        shared = asyncio.run(scenario())
        gc.collect()
        assert {name: source.releases[name] for name in shared} == dict.fromkeys(shared, 1)
    finally:
        sender.close()
        area.remove()


@pytest.mark.parametrize("why", ["worker draining", "worker full"])
def test_a_streams_end_for_a_request_this_worker_no_longer_holds_is_dropped_not_refused(why):
    """b returned before its stream's end and handed the request on to c, elsewhere: the request goes on. The
    end arriving late, while b's worker drains or is full, is no new request to refuse: refusing it would fail
    the client's request at the gateway."""

    class FirstChunkOnly:
        returned = False

        async def process(self, payload, ctx):
            async for _chunk in ctx.chunks():
                break
            self.returned = True
            return {"x": 1}

    async def scenario():
        stage = FirstChunkOnly()
        runtime = make_runtime([planned("b", next=["c"]), planned("c")], {"b": stage}, routes={"c": "unix:/c"})
        first = pb.Frame(request_id="r1", src="a", dst="b")
        runtime.codec.encode_into({"text": "hi", "options": {}}, first.chunk.opening.request)
        runtime.codec.encode_into({"v": 1}, first.chunk.value)
        runtime.on_frame(first, inbound_link)
        assert await poll_until(lambda: stage.returned and runtime.in_flight() == 0)
        assert runtime.links.bodies("unix:/c") == ["submit"]
        if why == "worker draining":
            await runtime.drain(0.0)
        else:
            runtime.requests.max_requests = 1
            runtime.requests.admit("held")  # another request takes the one place
        late = pb.Frame(request_id="r1", src="a", dst="b")
        late.end.SetInParent()
        runtime.on_frame(late, inbound_link)
        await asyncio.sleep(0.02)
        failures = [f.failure.message for f in runtime.links.sent.get(SINK, []) if f.request_id == "r1"]
        assert failures == []

    asyncio.run(scenario())


def test_a_request_still_held_when_the_drain_ends_fails_at_the_gateway_instead_of_being_dropped():
    """A stopping worker's leftovers: where no one else watches this worker for a request (a group routed as
    replicated, its sender done with the request), a request dropped unanswered waits for its client's deadline."""

    async def scenario():
        stage = Forever()
        runtime = make_runtime([planned("a")], {"a": stage})
        submit(runtime, "a")
        assert await poll_until(lambda: stage.started)
        await runtime.drain(0.05)
        (frame,) = runtime.links.sent[SINK]
        assert frame.request_id == "r1" and frame.failure.code == pb.FAILURE_CODE_UNAVAILABLE
        assert frame.failure.message.startswith("stage 'a' is unavailable: its worker stopped"), frame.failure
        assert stage.cancelled and runtime.in_flight() == 0

    asyncio.run(scenario())


def test_a_request_whose_first_frame_comes_after_the_drain_is_refused_at_the_gateway_and_never_runs():
    async def scenario():
        stage = Record({})
        runtime = make_runtime([planned("a")], {"a": stage})
        await runtime.drain(1.0)  # nothing held: it ends at once
        submit(runtime, "a", "late")
        submit(runtime, "a", "late")  # its next frame: dropped quietly
        assert await poll_until(lambda: runtime.links.sent.get(SINK))
        # What must not happen (a second refusal, the stage run): a short sleep gives either time to show.
        await asyncio.sleep(0.05)
        (frame,) = runtime.links.sent[SINK]
        assert frame.request_id == "late" and frame.failure.code == pb.FAILURE_CODE_UNAVAILABLE
        assert "its worker stopped" in frame.failure.message
        assert stage.payloads == [] and runtime.in_flight() == 0

    asyncio.run(scenario())


def test_a_terminal_stage_streaming_after_it_returned_is_told_instead_of_its_chunk_dropped_after_done():
    """The chunk would follow the request's Done to the gateway, which drops it: the late ctx.stream() raises."""
    late: list[BaseException] = []

    class Leaky:
        async def process(self, payload, ctx):
            await ctx.stream({"audio": np.zeros(4, np.float32), "sample_rate": 16000})

            async def later():
                await asyncio.sleep(0.01)
                try:
                    await ctx.stream({"audio": np.zeros(4, np.float32), "sample_rate": 16000})
                except RuntimeError as error:
                    late.append(error)

            asyncio.ensure_future(later())
            return None

    async def scenario():
        runtime = make_runtime([planned("a")], {"a": Leaky()})
        submit(runtime, "a")
        assert await poll_until(lambda: late, timeout=10)
        assert "stage 'a' streamed a chunk of request r1 after its process() returned" in str(late[0])
        assert runtime.links.bodies(SINK) == ["chunk", "done"]

    asyncio.run(scenario())


@pytest.mark.parametrize("terminal", [True, False], ids=["to the client", "to a stage in another worker"])
def test_a_send_left_waiting_for_credit_when_its_stream_ends_is_told_not_sent_after_the_end_or_left_waiting(
    terminal,
):
    """A task the stage left running waits for credit (the window is full) as process() returns: its chunk would
    follow the request's Done to the gateway, which drops it, or, on a stream to another worker whose window is
    no longer found to credit, it would wait for ever. It raises the late-stream RuntimeError instead."""
    late: list[BaseException] = []
    chunk = {"audio": np.zeros(4, np.float32), "sample_rate": 16000}

    class Leaky:
        async def process(self, payload, ctx):
            for _ in range(STREAM_WINDOW):
                await ctx.stream(chunk)  # no credit comes back in this test: the window is used up

            async def leftover():
                try:
                    await ctx.stream(chunk)
                except RuntimeError as error:
                    late.append(error)

            asyncio.ensure_future(leftover())
            await asyncio.sleep(0.01)  # the leftover send now waits for credit
            return None

    async def scenario():
        if terminal:
            runtime, address = make_runtime([planned("a")], {"a": Leaky()}), SINK
        else:
            stages = [planned("a", next=["b"], stream_to=["b"]), planned("b")]
            runtime, address = make_runtime(stages, {"a": Leaky()}, routes={"b": "unix:/b"}), "unix:/b"
        submit(runtime, "a")
        assert await poll_until(lambda: late, timeout=10)
        assert "stage 'a' streamed a chunk of request r1 after its process() returned" in str(late[0])
        assert runtime.links.bodies(address) == ["chunk"] * STREAM_WINDOW + ["done" if terminal else "end"]

    asyncio.run(scenario())
