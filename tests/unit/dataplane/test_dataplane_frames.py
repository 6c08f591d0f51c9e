"""Crafted and malformed data-plane frames: each fails only its own request, and state stays bounded."""

import asyncio

import numpy as np
from hypothesis import HealthCheck, given, settings

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.link.pieces import PieceAssembler
from stagevisor.supervisor.dataplane.link.frames import frame_bytes, parse_batch
from tests.fakes import FakeInboundLink, poll_until
from tests.unit.dataplane.frame_strategies import wire_batches
from tests.unit.dataplane.runtime_driver import SINK, Record, inbound_link, make_runtime, planned, submit


class Reader:
    """A stream_to target: reads every chunk, then streams one audio chunk to the client."""

    def __init__(self):
        self.started = 0

    async def process(self, payload, ctx):
        self.started += 1
        count = 0
        async for _ in ctx.chunks():
            count += 1
        await ctx.stream({"audio": np.zeros(4, np.float32), "sample_rate": 16000})
        return {"chunks": count}


def outcome(runtime, request_id):
    for frame in runtime.links.sent.get(SINK, []):
        if frame.request_id == request_id and frame.WhichOneof("body") in ("done", "failure"):
            return frame
    return None


def opening_chunk(request_id, src="engine", dst="vocoder"):
    frame = pb.Frame(request_id=request_id, src=src, dst=dst)
    frame.chunk.value.map.SetInParent()
    Codec().encode_into({"text": "x", "options": {}}, frame.chunk.opening.request)
    return frame


def test_a_malformed_frame_in_a_batch_spoils_only_itself():
    """Before: FrameBatch.FromString raised for the whole batch and the link (every request on it) died."""
    good = [pb.Frame(request_id=f"ok{i}", cancel=pb.Cancel(reason="r")) for i in range(3)]
    broken = frame_bytes(pb.Frame(request_id="victim", cancel=pb.Cancel(reason="r")))
    broken = broken[:-3] + b"\xff\xff\xff"  # the tail of its body is garbage
    data = frame_bytes(good[0]) + broken + frame_bytes(good[1]) + frame_bytes(good[2])
    frames, bad = parse_batch(data)
    assert [f.request_id for f in frames] == ["ok0", "ok1", "ok2"]
    assert [b.request_id for b in bad] == ["victim"]


def test_a_submit_to_an_unknown_stage_fails_its_request_naming_the_stage():
    """Before: the lookup raised inside a task outside the handler; no Failure was sent and the client hung."""

    async def scenario():
        runtime = make_runtime([planned("a")], {"a": Record()})
        submit(runtime, "nope", request_id="lost")
        submit(runtime, "a", request_id="fine")
        assert await poll_until(lambda: outcome(runtime, "lost") and outcome(runtime, "fine"))
        failure = outcome(runtime, "lost").failure
        assert "stage 'nope' is not served by worker 'test'" in failure.message
        assert outcome(runtime, "fine").WhichOneof("body") == "done"

    asyncio.run(scenario())


def test_openings_for_requests_that_never_complete_are_bounded_and_expire():
    """Before: 20,000 openings left 20,000 tasks waiting forever (RSS 333 -> 544 MB in the vocoder)."""

    async def scenario():
        reader = Reader()
        runtime = make_runtime([planned("vocoder")], {"vocoder": reader})
        runtime.max_requests = 50
        runtime.stream_idle_timeout = 30.0
        links = [FakeInboundLink(), FakeInboundLink()]  # two peers, each held to half the table
        for i in range(2000):
            runtime.on_frame(opening_chunk(f"ghost{i}"), links[i % 2])
        await asyncio.sleep(0)
        assert runtime.in_flight() == 50 and reader.started <= 50
        refused = [f for f in runtime.links.sent[SINK] if f.WhichOneof("body") == "failure"]
        assert len(refused) == 1950 and "already holds 50 requests" in refused[0].failure.message
        loop = asyncio.get_running_loop()
        assert runtime.expire_idle(loop.time() + 10) == 0  # not silent for long enough yet
        assert runtime.expire_idle(loop.time() + 31) == 50
        assert await poll_until(lambda: runtime.in_flight() == 0)
        expired = outcome(runtime, "ghost0").failure
        assert expired.code == pb.FAILURE_CODE_UNAVAILABLE and "received nothing from stage 'engine'" in expired.message

    asyncio.run(scenario())


def test_a_frame_that_does_not_decode_fails_only_its_request():
    async def scenario():
        runtime = make_runtime([planned("a")], {"a": Record()})
        frame = pb.Frame(request_id="bad", dst="a")
        frame.submit.request.tensor.CopyFrom(pb.Tensor(dtype="<f4", shape=[1 << 40], framework="numpy"))
        runtime.on_frame(frame, inbound_link)
        submit(runtime, "a", request_id="good")
        assert await poll_until(lambda: outcome(runtime, "bad") and outcome(runtime, "good"))
        assert "could not read a frame" in outcome(runtime, "bad").failure.message
        assert outcome(runtime, "good").WhichOneof("body") == "done"

    asyncio.run(scenario())


def test_a_stream_chunk_whose_packed_value_does_not_decode_fails_only_its_request():
    async def scenario():
        runtime = make_runtime([planned("vocoder")], {"vocoder": Reader()})
        runtime.on_frame(opening_chunk("bad"), inbound_link)
        chunk = pb.Frame(request_id="bad", src="engine", dst="vocoder")
        chunk.chunk.value.packed = Codec().encode({"audio": np.zeros(4, np.float32)}).packed[:-3]  # cut short
        credits_before = len(inbound_link.replies)
        runtime.on_frame(chunk, inbound_link)
        runtime.on_frame(opening_chunk("good"), inbound_link)
        end = pb.Frame(request_id="good", src="engine", dst="vocoder")
        end.end.SetInParent()
        runtime.on_frame(end, inbound_link)
        assert await poll_until(lambda: outcome(runtime, "bad") and outcome(runtime, "good"))
        failure = outcome(runtime, "bad").failure
        assert "could not read a frame" in failure.message and "packed value: cut short" in failure.message
        assert outcome(runtime, "good").WhichOneof("body") == "done"
        # The refused chunk's credit still goes back: its sender's window does not shrink.
        assert any(
            f.WhichOneof("body") == "credit" and f.request_id == "bad" for f in inbound_link.replies[credits_before:]
        )

    asyncio.run(scenario())


def test_inline_pieces_are_bounded_in_bytes_and_order():
    pieces = PieceAssembler(max_bytes=1000)
    assert pieces.add("r", pb.Piece(buffer="b", offset=0, data=b"x" * 10, total=2000)) is not None
    assert pieces.add("r", pb.Piece(buffer="b", offset=5, data=b"x", total=10)) is not None  # no start
    assert pieces.add("r", pb.Piece(buffer="c", offset=0, data=b"x" * 4, total=10)) is None
    assert pieces.add("r", pb.Piece(buffer="c", offset=7, data=b"x" * 4, total=10)) is not None  # a gap
    assert len(pieces) == 0 and pieces.bytes == 0


def test_inline_pieces_nobody_claims_expire():
    now = [0.0]
    pieces = PieceAssembler(idle=5.0, clock=lambda: now[0])
    assert pieces.add("r", pb.Piece(buffer="old", offset=0, data=b"x", total=1)) is None
    now[0] = 10.0
    assert pieces.add("r", pb.Piece(buffer="new", offset=0, data=b"y", total=1)) is None
    assert len(pieces) == 1 and bytes(pieces.take("new", 1)) == b"y"


# ---- property-based: whatever arrives, the worker goes on serving ----------------------------


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=wire_batches())
def test_random_and_mutated_frames_never_escape_and_other_requests_complete(batch):
    async def scenario():
        runtime = make_runtime(
            [planned("a", next=["vocoder"]), planned("vocoder", stream_to=[])],
            {"a": Record({"ok": 1}), "vocoder": Reader()},
        )
        runtime.stream_idle_timeout = 0.05
        frames_in, bad = parse_batch(batch)
        for item in bad:
            runtime.on_bad_frame(item, inbound_link)
        for frame in frames_in:
            runtime.on_frame(frame, inbound_link)  # must never raise
        submit(runtime, "a", request_id="good")
        assert await poll_until(lambda: outcome(runtime, "good") is not None, timeout=5)
        assert outcome(runtime, "good").WhichOneof("body") == "done"
        # Whatever the crafted frames started ends: nothing waits forever.
        assert await poll_until(lambda: runtime.in_flight() == 0, timeout=5)
        await runtime.close()

    asyncio.run(scenario())


def test_warnings_about_bad_frames_are_rate_limited():
    import logging

    from stagevisor.supervisor.logs import Throttled

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    logger = logging.getLogger("test.throttled")
    handler = Lines()
    logger.addHandler(handler)
    now = [0.0]
    throttled = Throttled(logger, burst=3, window=60.0, clock=lambda: now[0])
    for i in range(1000):
        throttled.warning("bad frame %d", i)
    now[0] = 61.0
    throttled.warning("bad frame again")
    logger.removeHandler(handler)
    assert handler.lines == [
        "bad frame 0",
        "bad frame 1",
        "bad frame 2",
        "997 more such data-plane warnings in the last 61 s were not logged",
        "bad frame again",
    ]


def test_one_peer_flooding_openings_leaves_the_other_peers_their_places():
    """Before: one peer's 5,000 valid openings filled the worker's 4,096-request table; every other request got
    UNAVAILABLE until that link closed. Now a link holds at most half the table (limits.per_peer_cap)."""

    async def scenario():
        reader = Reader()
        runtime = make_runtime([planned("vocoder")], {"vocoder": reader})
        runtime.max_requests = 100
        flooder, honest = FakeInboundLink(), FakeInboundLink()
        for i in range(5000):
            runtime.on_frame(opening_chunk(f"flood{i}"), flooder)
        await asyncio.sleep(0)
        assert runtime.in_flight() == 50
        for i in range(40):
            runtime.on_frame(opening_chunk(f"real{i}"), honest)
        await asyncio.sleep(0)
        assert runtime.in_flight() == 90
        assert all(outcome(runtime, f"real{i}") is None for i in range(40))  # none refused
        refused = outcome(runtime, "flood4999").failure
        assert refused.code == pb.FAILURE_CODE_UNAVAILABLE and "50 of worker 'test'" in refused.message

    asyncio.run(scenario())
