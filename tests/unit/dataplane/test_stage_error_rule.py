"""The StageError rule at the gateway: a StageError's text reaches the client, sanitized and bounded; nothing else's."""

from __future__ import annotations

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.client_failures import MAX_ECHOED_CHARS, client_text, public_failure

GENERIC = "stage 'vocoder' failed; the daemon log has the details"


def failure(
    code: int = pb.FAILURE_CODE_INTERNAL, message: str = "", client_message: str = "", error_type: str = ""
) -> pb.Failure:
    return pb.Failure(stage="vocoder", code=code, message=message, client_message=client_message, error_type=error_type)


def test_a_stage_error_reaches_the_client_naming_the_stage():
    status, text = public_failure(
        failure(message="stage 'vocoder' failed: voice 'x' is not loaded", client_message="voice 'x' is not loaded")
    )
    assert (status, text) == ("INTERNAL", "stage 'vocoder' failed: voice 'x' is not loaded")


def test_any_other_exception_is_redacted_to_the_generic_message():
    status, text = public_failure(failure(message="stage 'vocoder' failed: token=hunter2 at /srv/weights"))
    assert (status, text) == ("INTERNAL", GENERIC)


def test_any_other_exception_reaches_the_client_as_its_class_only():
    status, text = public_failure(
        failure(message="stage 'vocoder' failed: [Errno 2] /srv/weights/token=hunter2", error_type="OSError")
    )
    assert (status, text) == ("INTERNAL", "stage 'vocoder' failed with OSError; the daemon log has the details")


def test_an_exception_class_name_is_sanitized_and_bounded_like_any_text_a_worker_sends():
    _, text = public_failure(failure(error_type="Bad\nName" + "x" * 500))
    assert text == f"stage 'vocoder' failed with Bad Name{'x' * 52}; the daemon log has the details"


def test_an_invalid_request_reaches_the_client_as_invalid_argument():
    status, text = public_failure(
        failure(pb.FAILURE_CODE_INVALID_ARGUMENT, "noise_scale must be a number", "noise_scale must be a number")
    )
    assert (status, text) == ("INVALID_ARGUMENT", "stage 'vocoder' rejected the request: noise_scale must be a number")


def test_a_stage_error_text_loses_control_characters_and_extra_whitespace():
    written = "line one\nline two\r\n\x1b[31mred\x1b[0m\ttab \u202egnp.exe\u2028end  "
    _, text = public_failure(failure(client_message=written))
    assert text == "stage 'vocoder' failed: line one line two [31mred [0m tab gnp.exe end"
    assert not any(ord(c) < 32 or c in "\u202e\u2028" for c in text)


def test_a_long_stage_error_text_is_cut_saying_how_much_was_left_out():
    _, text = public_failure(failure(client_message="x" * 5000))
    left_out = 5000 - MAX_ECHOED_CHARS
    assert text == "stage 'vocoder' failed: " + "x" * MAX_ECHOED_CHARS + f"... ({left_out} more characters)"


def test_a_stage_error_of_only_whitespace_gets_the_generic_message():
    assert public_failure(failure(client_message=" \n\t "))[1] == GENERIC


def test_client_text_keeps_printable_unicode():
    assert client_text("Grüße, 你好 — fine") == "Grüße, 你好 — fine"


def test_under_a_failure_storm_every_request_id_a_client_was_given_is_in_the_daemon_log(tmp_path):
    """
    1. a stage raises OSError for 200 requests at once; each client is told "the daemon log has the details
       (request <id>)";
    2. through the daemon's log filter (5 lines of a kind per 10 s), every one of those ids is still logged,
       with the stage, the exception's class and its message; the rate limit used to drop all but the first 5.
    """
    import io
    import logging

    from stagevisor.supervisor.dataplane.gateway import Gateway
    from stagevisor.supervisor.dataplane.request_handle import RequestHandle
    from stagevisor.supervisor.dataplane.routing import SINK
    from stagevisor.supervisor.logs import RepeatFilter
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    plan = plan_placement(PlacementRequest("demo"))
    gateway = Gateway(plan, {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}, "unix:/x", shm_root=tmp_path)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RepeatFilter())
    logger = logging.getLogger("stagevisor.supervisor.dataplane.gateway")
    logger.addHandler(handler)
    ids = [f"{n:032x}" for n in range(200)]
    try:
        for request_id in ids:
            gateway.requests[request_id] = RequestHandle(gateway, request_id, expected_done=1)
            message = "stage 'vocoder' failed: [Errno 5] /srv/weights unreadable"
            frame = pb.Frame(request_id=request_id, src="vocoder", dst=SINK, failure=failure(message=message))
            frame.failure.error_type = "OSError"
            gateway._handle_frame(frame, None)
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ids
    assert all("in stage 'vocoder' (OSError): stage 'vocoder' failed: [Errno 5]" in line for line in lines)
