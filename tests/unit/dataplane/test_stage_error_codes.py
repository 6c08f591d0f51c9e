"""A StageError's `code` on each hop of its failure: the runner's Failure frame, the link's wire encoding, the
gateway's RequestFailed, gRPC's trailing metadata; what is not a code is dropped on the way, never passed on."""

from __future__ import annotations

import asyncio

import pytest

from stagevisor.stages.base import MAX_ERROR_CODE_CHARS, InvalidRequest, StageError
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.limits import AUDIO_LIMIT_EXCEEDED, LimitExceeded
from stagevisor.supervisor.dataplane.link.frames import frame_bytes, parse_batch
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.routing import SINK
from stagevisor.supervisor.dataplane.synthesis import ERROR_CODE_KEY, ERROR_FIELD_KEY, failure_metadata
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.fakes import poll_until
from tests.unit.dataplane.client_reading import read_failure
from tests.unit.dataplane.runtime_driver import SINK as SINK_ADDRESS
from tests.unit.dataplane.runtime_driver import make_runtime, planned, submit


class Raises:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def process(self, payload, ctx):
        raise self.error


def failure_sent(error: BaseException) -> pb.Failure:
    """The Failure frame the worker sends the gateway when the stage raises `error`."""

    async def scenario() -> pb.Failure:
        runtime = make_runtime([planned("engine")], {"engine": Raises(error)})
        submit(runtime, "engine")
        assert await poll_until(lambda: "failure" in runtime.links.bodies(SINK_ADDRESS), timeout=10)
        return runtime.links.sent[SINK_ADDRESS][-1].failure

    return asyncio.run(scenario())


def test_an_invalid_requests_code_travels_in_its_failure_frame_beside_its_text():
    failure = failure_sent(InvalidRequest("voice 'x' is not loaded", code="ENGINE_UNKNOWN_VOICE"))
    assert failure.code == pb.FAILURE_CODE_INVALID_ARGUMENT
    assert (failure.client_code, failure.client_message) == ("ENGINE_UNKNOWN_VOICE", "voice 'x' is not loaded")


def test_a_stage_errors_code_travels_in_its_failure_frame():
    failure = failure_sent(StageError("the cache is full; retry", code="ENGINE_BUSY"))
    assert failure.code == pb.FAILURE_CODE_INTERNAL and failure.client_code == "ENGINE_BUSY"


def test_a_stage_error_without_a_code_and_any_other_exception_send_none():
    assert failure_sent(StageError("no voice")).client_code == ""
    other = OSError("disk full")
    other.code = "LOOKS_LIKE_ONE"  # type: ignore[attr-defined]
    assert failure_sent(other).client_code == ""  # only a StageError's code is written for the client


def test_a_code_a_subclass_names_as_a_class_attribute_travels_too():
    class UnknownVoice(InvalidRequest):
        code = "ENGINE_UNKNOWN_VOICE"

    failure = failure_sent(UnknownVoice("voice 'x' is not loaded"))
    assert (failure.client_code, failure.client_message) == ("ENGINE_UNKNOWN_VOICE", "voice 'x' is not loaded")


class LateCode(InvalidRequest):
    """A stage's own subclass that sets `code` itself, after StageError checked it, or never calls its __init__."""

    def __init__(self, code: object) -> None:
        Exception.__init__(self, "refused")
        self.code = code  # type: ignore[assignment]


@pytest.mark.parametrize("code", ["lower_case", "A" * (MAX_ERROR_CODE_CHARS + 1), "X\nY", 42, None])
def test_a_code_a_subclass_set_unchecked_is_dropped_by_the_worker(code):
    failure = failure_sent(LateCode(code))
    assert failure.client_code == "" and failure.client_message == "refused"


def wire(failure: pb.Failure) -> pb.Frame:
    """The frame as the gateway reads it off a link: serialized as sent, parsed as received."""
    frame = pb.Frame(request_id="r1", src="engine", dst=SINK, failure=failure)
    frames, bad = parse_batch(frame_bytes(frame))
    assert bad == []
    return frames[0]


def test_the_code_crosses_the_link_and_a_frame_without_it_reads_as_none():
    sent = pb.Failure(stage="engine", code=pb.FAILURE_CODE_INVALID_ARGUMENT, client_message="no", client_code="X_Y")
    assert wire(sent).failure.client_code == "X_Y"
    # A worker of a release before the field sends no field 6: the failure reads as before, with no code.
    older = pb.Failure(stage="engine", code=pb.FAILURE_CODE_INVALID_ARGUMENT, client_message="no")
    assert wire(older).failure.client_code == "" and wire(older).failure.client_message == "no"


def failed_at_gateway(tmp_path, failure: pb.Failure) -> RequestFailed:
    """What a client of the gateway gets when a worker sends `failure` for its request."""
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    handle = RequestHandle(gateway, "r1", expected_done=1)
    gateway.requests["r1"] = handle
    gateway._handle_frame(wire(failure), link=None)  # type: ignore[arg-type]
    return read_failure(handle)


def test_the_gateway_passes_the_stages_code_to_the_client_beside_status_and_message(tmp_path):
    failure = pb.Failure(stage="vocoder", code=pb.FAILURE_CODE_INVALID_ARGUMENT, client_message="no", client_code="X_Y")
    failed = failed_at_gateway(tmp_path, failure)
    assert (failed.status, failed.code, failed.stage) == ("INVALID_ARGUMENT", "X_Y", "vocoder")
    assert failed.message == "stage 'vocoder' rejected the request: no"


@pytest.mark.parametrize("code", ["x_y", "A" * (MAX_ERROR_CODE_CHARS + 1), "X Y", "X\u202eY", "_X"])
def test_the_gateway_drops_what_is_not_a_code_and_keeps_the_rest_of_the_failure(tmp_path, code):
    failure = pb.Failure(stage="vocoder", code=pb.FAILURE_CODE_INTERNAL, client_message="busy", client_code=code)
    failed = failed_at_gateway(tmp_path, failure)
    assert (failed.status, failed.code, failed.message) == ("INTERNAL", "", "stage 'vocoder' failed: busy")


def test_grpc_trailing_metadata_carries_the_stages_code():
    failed = RequestFailed("INVALID_ARGUMENT", "no", stage="engine", request_id="ab12", code="X_Y")
    assert dict(failure_metadata(failed)) == {
        "stagevisor-request-id": "ab12",
        "stagevisor-stage": "engine",
        ERROR_CODE_KEY: "X_Y",
    }
    assert ERROR_CODE_KEY == "stagevisor-error-code"


def test_grpc_trailing_metadata_has_no_code_where_no_stage_gave_one():
    assert ERROR_CODE_KEY not in dict(failure_metadata(RequestFailed("INTERNAL", "x", request_id="ab12")))
    # The audio cap's code is the HTTP API's (a 400 there); gRPC says RESOURCE_EXHAUSTED as it always did.
    limited = LimitExceeded("RESOURCE_EXHAUSTED", "too long", code=AUDIO_LIMIT_EXCEEDED)
    assert ERROR_CODE_KEY not in dict(failure_metadata(limited))


def test_the_field_a_stage_error_names_travels_in_its_failure_frame():
    failure = failure_sent(InvalidRequest("voice 'x' is not loaded", code="ENGINE_UNKNOWN_VOICE", field="voice"))
    assert (failure.client_code, failure.client_field) == ("ENGINE_UNKNOWN_VOICE", "voice")
    assert failure_sent(StageError("busy")).client_field == ""


class LateField(InvalidRequest):
    """A stage's own subclass that sets `field` itself, after StageError checked it."""

    def __init__(self, field: object) -> None:
        Exception.__init__(self, "refused")
        self.field = field  # type: ignore[assignment]


@pytest.mark.parametrize("field", ["", "a b", "x\ny", "9" * 65, 3])
def test_a_field_a_subclass_set_unchecked_is_dropped_by_the_worker(field):
    assert failure_sent(LateField(field)).client_field == ""


def test_the_gateway_passes_the_stages_field_to_the_client_and_drops_what_is_no_field_name(tmp_path):
    named = pb.Failure(stage="engine", code=pb.FAILURE_CODE_INVALID_ARGUMENT, client_message="no", client_field="voice")
    assert failed_at_gateway(tmp_path, named).field == "voice"
    garbled = pb.Failure(
        stage="engine", code=pb.FAILURE_CODE_INVALID_ARGUMENT, client_message="no", client_field="a\nb"
    )
    assert failed_at_gateway(tmp_path, garbled).field == ""


def test_grpc_trailing_metadata_carries_the_field_the_stage_names():
    failed = RequestFailed("INVALID_ARGUMENT", "no", stage="engine", request_id="ab12", code="X_Y", field="voice")
    assert dict(failure_metadata(failed))[ERROR_FIELD_KEY] == "voice"
    assert ERROR_FIELD_KEY == "stagevisor-error-field"
    assert ERROR_FIELD_KEY not in dict(failure_metadata(RequestFailed("INVALID_ARGUMENT", "no", request_id="ab12")))
