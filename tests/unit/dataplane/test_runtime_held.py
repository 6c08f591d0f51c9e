"""A worker's requests in flight when a replica or link they use is lost or cannot be had, and its keepalives."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.link.outbound import FrameTooLarge
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from tests.fakes import poll_until
from tests.fakes import RecordedLinks
from tests.unit.dataplane.runtime_driver import SINK, make_runtime, planned, submit

GROUP, REPLICA, OTHER = "unix:/b.sock", "unix:/b1.sock", "unix:/b2.sock"


class StreamsThenWaits:
    """Stage `a`: streams a chunk to `b`, then holds the request until it is cancelled."""

    async def process(self, payload, ctx):
        await ctx.stream({"i": 0})
        await asyncio.Event().wait()


async def holding():
    """A worker whose stage `a` streams r1 to `b`'s replica at REPLICA and still holds it."""
    runtime = make_runtime([planned("a", next=["b"], stream_to=["b"])], {"a": StreamsThenWaits()}, {"b": GROUP})
    runtime.router.set_ready(GROUP, (GROUP, REPLICA, OTHER))
    runtime.router.in_flight[GROUP] = runtime.router.in_flight[OTHER] = 1  # busier: r1 goes to REPLICA
    submit(runtime, "a", request_id="r1")
    assert await poll_until(lambda: runtime.links.bodies(REPLICA) == ["chunk"])
    return runtime


def failures(runtime) -> list[pb.Failure]:
    return [f.failure for f in runtime.links.sent.get(SINK, []) if f.HasField("failure")]


def test_a_lost_replica_fails_once_the_requests_streaming_to_it_and_names_the_replica():
    async def scenario():
        runtime = await holding()
        runtime.replica_lost(OTHER)  # another replica: r1 never went there
        assert failures(runtime) == []
        runtime.replica_lost(REPLICA)
        runtime.replica_lost(REPLICA)  # told twice (the daemon's word and a broken link): one failure
        return failures(runtime)

    (failure,) = asyncio.run(scenario())
    assert failure.code == pb.FAILURE_CODE_UNAVAILABLE
    assert failure.message == "the worker serving stage 'b' (replica at b1.sock) went down; retry"


def test_a_link_that_breaks_fails_the_requests_that_sent_frames_on_it():
    async def scenario():
        runtime = await holding()
        (link,) = [link for link in runtime.requests.get("r1").links if link.address == REPLICA]
        runtime.on_link_broken(link, ConnectionResetError())
        return failures(runtime)

    (failure,) = asyncio.run(scenario())
    assert failure.code == pb.FAILURE_CODE_UNAVAILABLE and "became unreachable" in failure.message


def test_a_worker_says_it_still_holds_each_request_it_works_on():
    runtime = make_runtime([planned("a")], {})
    runtime._keep_alive(["r1", "r2"])
    frames = runtime.links.sent[SINK]  # the gateway's sink
    assert [(f.request_id, f.WhichOneof("body")) for f in frames] == [("r1", "keepalive"), ("r2", "keepalive")]


class Unreachable(RecordedLinks):
    """The link to "b" cannot be had (`how="dial"`), or refuses the frame as too large (`how="size"`)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def get(self, address):
        if address == GROUP and self.how == "dial":
            raise OSError("no such socket")
        link = super().get(address)
        if address == GROUP and self.how == "size":

            async def refuse(frame, out=None):
                raise FrameTooLarge(frame, 9 << 30)

            link.send_async = refuse
        return link


@pytest.mark.parametrize("how", ["dial", "size"])
def test_a_frame_that_cannot_be_sent_gives_its_shared_buffers_back_and_fails_its_request(tmp_path, how):
    """The codec put the payload's array out of line for the frame to `b`; nothing will release that buffer if the
    frame never leaves, so the pool takes it back (else each such failure keeps a file of shared memory)."""

    class Hands:
        async def process(self, payload, ctx):
            return {"frames": np.zeros(4096, np.float32)}

    area = shm.SharedArea.create(tmp_path / "area")
    codec = Codec(area=area, shm_threshold=1024)
    runtime = StageRuntime({"a": planned("a", next=["b"])}, {"a": Hands()}, {"b": GROUP}, SINK, "test", codec)
    runtime.links = Unreachable(how)

    async def scenario():
        submit(runtime, "a", request_id="r1")
        assert await poll_until(lambda: failures(runtime))

    try:
        asyncio.run(scenario())
        assert codec.pool is not None and codec.pool.busy() == 0
    finally:
        codec.close()
        area.remove()
