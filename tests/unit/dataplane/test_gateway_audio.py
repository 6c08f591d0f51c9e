"""A terminal stage's chunk the daemon cannot play fails its request naming the stage, on every endpoint alike."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.dataplane.routing import SINK
from stagevisor.supervisor.dataplane.synthesis import SynthesisServicer
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.request import SpeechRequest
from stagevisor.supervisor.http.speech import open_speech
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.fakes import Aborted, FakeServicerContext, RecordedLink


def streamed(tmp_path, *chunks) -> tuple[Gateway, RequestHandle, RecordedLink]:
    """A gateway and its one request "r1", to which the vocoder has streamed `chunks` and then finished."""
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    handle = RequestHandle(gateway, "r1", expected_done=1)
    gateway.requests["r1"] = handle
    link = RecordedLink("worker")
    for chunk in chunks:
        value = Codec().encode(chunk)
        gateway._handle_frame(pb.Frame(request_id="r1", src="vocoder", dst=SINK, chunk=pb.Chunk(value=value)), link)
    gateway._handle_frame(pb.Frame(request_id="r1", src="vocoder", dst=SINK, done=pb.Done()), link)
    return gateway, handle, link


async def stream_one(tmp_path, *chunks) -> tuple[list, RequestFailed | None, int]:
    """The chunks a client reads and the failure it gets when the vocoder streams `chunks`, and the credits."""
    _, handle, link = streamed(tmp_path, *chunks)
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
        # An echo of a reference WAV whose header says 4294967295 Hz: gRPC's int32 AudioChunk.sample_rate failed
        # to take it, and the client got INTERNAL "the daemon failed with ValueError".
        ({"audio": np.zeros(160, np.float32), "sample_rate": 2**32 - 1}, "'sample_rate' 4.29497e+09, more than"),
        ({"audio": np.zeros(160, np.float32), "sample_rate": 2**31}, "'sample_rate' 2.14748e+09, more than"),
    ],
    ids=["bare array", "rate as text", "no rate", "rate 0", "fractional rate", "rate past uint32", "rate past int32"],
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


def test_the_largest_rate_an_audio_chunk_carries_reaches_the_client(tmp_path):
    chunk = {"audio": np.zeros(160, np.float32), "sample_rate": 2**31 - 1}
    received, failure, _ = asyncio.run(stream_one(tmp_path, chunk))
    assert failure is None and len(received) == 1


def test_a_sample_rate_that_changes_within_a_request_fails_it_naming_the_stage(tmp_path):
    first = {"audio": np.zeros(160, np.float32), "sample_rate": 16000}
    second = {"audio": np.zeros(240, np.float32), "sample_rate": 24000}
    received, failure, credits = asyncio.run(stream_one(tmp_path, first, second))
    assert len(received) == 1 and failure is not None
    assert (failure.status, failure.stage) == ("INTERNAL", "vocoder")
    assert failure.message.startswith("stage 'vocoder' streamed audio at 24000 Hz after audio at 16000 Hz")
    assert credits == 2


@pytest.mark.parametrize("chunk", [{"sample_rate": 16000}, {"text": "no audio"}], ids=["rate only", "text"])
def test_a_chunk_without_audio_fails_the_request_as_internal_naming_the_stage(tmp_path, chunk):
    received, failure, credits = asyncio.run(stream_one(tmp_path, chunk))
    assert received == [] and failure is not None
    assert (failure.status, failure.stage) == ("INTERNAL", "vocoder")
    assert failure.message.startswith("stage 'vocoder' streamed a chunk without 'audio'; a terminal stage streams")
    assert credits == 1


# ---- what each endpoint's client gets: the gateway's failure, the gateway being the only check ----------------


class Entry:
    """The public endpoints' view of the gateway (PipelineEntry, SpeechGateway), admitting only `handle`."""

    admission = Admission()
    limits = RequestLimits()
    metrics = None
    max_text_chars = DEFAULT_MAX_TEXT_CHARS
    stage_groups: dict = {}

    def __init__(self, handle: RequestHandle) -> None:
        self.handle = handle

    async def submit(self, payload: dict) -> RequestHandle:
        return self.handle


class Meter:
    """A request meter that records the outcome each request is counted with."""

    exports_spans = False

    def __init__(self) -> None:
        self.finished: list[str] = []

    def attach(self, handle) -> None:
        pass

    def audio(self, samples: int, rate: int) -> None:
        pass

    def finish(self, code: str) -> None:
        self.finished.append(code)


NO_AUDIO = {"text": "no audio"}
AT_16K = {"audio": np.zeros(160, np.float32), "sample_rate": 16000}
AT_24K = {"audio": np.zeros(240, np.float32), "sample_rate": 24000}
SPEECH = SpeechRequest(model="m", input="Hello.", response_format="pcm")


def test_over_http_a_first_chunk_without_audio_is_a_500_naming_the_stage_and_closes_the_request(tmp_path):
    async def scenario():
        gateway, handle, _ = streamed(tmp_path, NO_AUDIO)
        meter = Meter()
        with pytest.raises(ApiError) as caught:
            await open_speech(Entry(handle), SPEECH, 24000, meter)
        return caught.value, meter, gateway.in_flight()

    error, meter, in_flight = asyncio.run(scenario())
    assert error.status == 500
    assert error.message.startswith("stage 'vocoder' streamed a chunk without 'audio'")
    assert meter.finished == ["INTERNAL"] and in_flight == 0


def test_over_http_a_sample_rate_change_mid_stream_fails_the_stream_as_internal(tmp_path):
    async def scenario():
        _, handle, _ = streamed(tmp_path, AT_16K, AT_24K)
        meter = Meter()
        stream = await open_speech(Entry(handle), SPEECH, 24000, meter)
        try:
            with pytest.raises(RequestFailed) as caught:
                async for _ in stream.pieces():
                    pass
        finally:
            stream.close()
        return caught.value, meter

    error, meter = asyncio.run(scenario())
    assert (error.status, error.stage) == ("INTERNAL", "vocoder")
    assert error.message.startswith("stage 'vocoder' streamed audio at 24000 Hz after audio at 16000 Hz")
    assert meter.finished == ["INTERNAL"]


@pytest.mark.parametrize(
    "chunks, complaint",
    [((NO_AUDIO,), "a chunk without 'audio'"), ((AT_16K, AT_24K), "audio at 24000 Hz after audio at 16000 Hz")],
    ids=["no audio", "rate change"],
)
def test_over_grpc_an_unplayable_chunk_is_internal_naming_the_stage_and_closes_the_request(tmp_path, chunks, complaint):
    async def scenario():
        gateway, handle, _ = streamed(tmp_path, *chunks)
        context = FakeServicerContext()
        with pytest.raises(Aborted) as caught:
            await SynthesisServicer(lambda: Entry(handle)).Synthesize(spb.SynthesizeRequest(text="Hello."), context)
        return caught.value, context.written, gateway.in_flight()

    aborted, written, in_flight = asyncio.run(scenario())
    assert aborted.code == grpc.StatusCode.INTERNAL
    assert aborted.details.startswith(f"stage 'vocoder' streamed {complaint}")
    assert aborted.details.endswith("(request r1)")
    assert len(written) == len(chunks) - 1 and in_flight == 0  # the audio before the bad chunk was sent
