"""A terminal stage's chunk the daemon cannot play fails its request naming the stage, on every endpoint alike."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.gateway import Gateway, RequestHandle
from stagevisor.supervisor.dataplane.runtime import SINK
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


class Link:
    """The inbound link a chunk came on: counts the credits the gateway returns."""

    peer = "worker"

    def __init__(self) -> None:
        self.credits = 0

    def credit(self, stream) -> None:
        self.credits += 1


async def stream_one(tmp_path, *chunks) -> tuple[list, RequestFailed | None, int]:
    """The chunks a client reads and the failure it gets when the vocoder streams `chunks`, and the credits."""
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    handle = RequestHandle(gateway, "r1", expected_done=1)
    gateway._requests["r1"] = handle
    link = Link()
    for chunk in chunks:
        value = Codec().encode(chunk)
        gateway._handle_frame(pb.Frame(request_id="r1", src="vocoder", dst=SINK, chunk=pb.Chunk(value=value)), link)
    gateway._handle_frame(pb.Frame(request_id="r1", src="vocoder", dst=SINK, done=pb.Done()), link)
    received, failure = [], None
    try:
        async for item in handle:
            received.append(item)
    except RequestFailed as error:
        failure = error
    return received, failure, link.credits


@pytest.mark.parametrize(
    "chunk, complaint",
    [
        (np.zeros(160, np.float32), "a chunk of type ndarray, not a dict"),
        ({"audio": np.zeros(160, np.float32), "sample_rate": "16k"}, "'sample_rate' of type str"),
        ({"audio": np.zeros(160, np.float32)}, "'audio' without a 'sample_rate'"),
        ({"audio": np.zeros(160, np.float32), "sample_rate": 0}, "'sample_rate' 0, not a positive int"),
        ({"audio": np.zeros(160, np.float32), "sample_rate": 22050.5}, "'sample_rate' 22050.5"),
    ],
    ids=["bare array", "rate as text", "no rate", "rate 0", "fractional rate"],
)
def test_a_chunk_without_a_playable_sample_rate_fails_the_request_naming_the_stage(tmp_path, chunk, complaint):
    received, failure, _ = asyncio.run(stream_one(tmp_path, chunk))
    assert received == [] and failure is not None and failure.stage == "vocoder"
    assert failure.message.startswith(f"stage 'vocoder' streamed {complaint}")


@pytest.mark.parametrize(
    "audio, complaint",
    [
        (b"\x00\x01" * 160, "'audio' as bytes"),
        (np.full(160, 1000, np.int16), "'audio' of dtype int16"),
        (np.zeros((160, 2), np.float32), "'audio' of shape [160, 2]: several channels"),
    ],
    ids=["bytes", "int16", "stereo"],
)
def test_audio_the_daemon_cannot_play_fails_the_request_as_internal_naming_the_stage(tmp_path, audio, complaint):
    received, failure, credits = asyncio.run(stream_one(tmp_path, {"audio": audio, "sample_rate": 16000}))
    assert received == [] and failure is not None
    assert failure.status == "INTERNAL" and failure.stage == "vocoder"
    assert failure.message.startswith(f"stage 'vocoder' streamed {complaint}")
    assert "1-D float32 numpy array in [-1, 1]" in failure.message
    assert credits == 1  # the refused chunk's credit goes back to the worker


@pytest.mark.parametrize(
    "audio",
    [np.zeros(160, np.float32), np.zeros((1, 160), np.float32), np.zeros(160)],
    ids=["1-D", "(1, N)", "float64"],
)
def test_mono_float_audio_reaches_the_client(tmp_path, audio):
    received, failure, _ = asyncio.run(stream_one(tmp_path, {"audio": audio, "sample_rate": np.int64(16000)}))
    assert failure is None and len(received) == 1


def test_a_sample_rate_that_changes_within_a_request_fails_it_naming_the_stage(tmp_path):
    first = {"audio": np.zeros(160, np.float32), "sample_rate": 16000}
    second = {"audio": np.zeros(240, np.float32), "sample_rate": 24000}
    received, failure, credits = asyncio.run(stream_one(tmp_path, first, second))
    assert len(received) == 1 and failure is not None
    assert (failure.status, failure.stage) == ("INTERNAL", "vocoder")
    assert failure.message.startswith("stage 'vocoder' streamed audio at 24000 Hz after audio at 16000 Hz")
    assert credits == 2
