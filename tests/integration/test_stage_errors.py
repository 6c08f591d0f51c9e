"""The StageError rule end to end: its text, and its code, reach gRPC and HTTP clients; of any other exception they
learn the class and a request id, on every path (gRPC, HTTP JSON, SSE, batch, WebSocket), and its text stays in the
log."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
from tests.integration.daemon_helpers import ROOT, DaemonProcess, make_plan, poll_until
from tests.integration.http_stages import CODE, CODED_TEXT, SECRET_TEXT

REFUSER = "tests.integration.http_stages:make_refuser"
WRITTEN = "the voice 'ghost' is not loaded here; ask for one of: joe"  # STAGE_ERROR_TEXT, sanitized
GENERIC = "stage 'refuser' failed with RuntimeError; the daemon log has the details"


@pytest.fixture(scope="module")
def daemon():
    plan = make_plan("refuser", [("refuser", "pipeline", None, None)], factories={"refuser": REFUSER})
    with DaemonProcess(plan, "--http", "127.0.0.1:0") as running:
        running.wait_serving()
        yield running


def grpc_failure(daemon: DaemonProcess, fail: str) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with grpc.insecure_channel(daemon.listen) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        request = synthesis_pb2.SynthesizeRequest(text="hello", options={"fail": fail})
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Synthesize(request, timeout=60))
    error = caught.value
    return error.code(), error.details(), dict(error.trailing_metadata() or ())


def http_failure(daemon: DaemonProcess, fail: str) -> tuple[int, dict]:
    body = json.dumps({"model": "refuser", "input": "hello", "response_format": "pcm", "fail": fail}).encode()
    request = urllib.request.Request(
        daemon.http_url() + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    return caught.value.code, json.loads(caught.value.read())["error"]


def test_a_stage_error_reaches_a_grpc_client_with_the_stage_and_request_id(daemon):
    code, details, trailers = grpc_failure(daemon, "stage_error")
    assert code == grpc.StatusCode.INTERNAL
    assert details == f"stage 'refuser' failed: {WRITTEN} (request {trailers['stagevisor-request-id']})"
    assert trailers["stagevisor-stage"] == "refuser"


def test_a_stages_code_reaches_grpc_metadata_the_cli_and_the_http_error_code(daemon, tmp_path):
    """A stage raises InvalidRequest(..., code="X_Y"): before, every client got only the status (HTTP `code`:
    `invalid_argument`), the code nowhere unless the stage wrote it into its text."""
    code, details, trailers = grpc_failure(daemon, "coded")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        details == f"stage 'refuser' rejected the request: {CODED_TEXT} (request {trailers['stagevisor-request-id']})"
    )
    assert (trailers["stagevisor-error-code"], trailers["stagevisor-stage"]) == (CODE, "refuser")

    said = subprocess.run(
        [sys.executable, "-m", "stagevisor", "synthesize", "Hi.", "--address", daemon.listen, "--option", "fail=coded",
         "-o", str(tmp_path / "hi.wav")],
        cwd=ROOT, env=daemon.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert said.returncode == 2, said.stderr
    assert said.stderr.startswith(
        f"error: synthesis failed (INVALID_ARGUMENT, {CODE}): stage 'refuser' rejected the request: {CODED_TEXT}"
    ), said.stderr

    status, error = http_failure(daemon, "coded")
    assert (status, error["type"], error["code"]) == (400, "invalid_request_error", CODE)
    assert error["message"].startswith(f"stage 'refuser' rejected the request: {CODED_TEXT} (request ")


def test_a_stage_error_without_a_code_keeps_the_status_as_its_code(daemon):
    _, _, trailers = grpc_failure(daemon, "stage_error")
    assert "stagevisor-error-code" not in trailers
    status, error = http_failure(daemon, "stage_error")
    assert (status, error["code"]) == (500, "internal")


def test_any_other_exception_reaches_a_grpc_client_only_as_the_generic_message(daemon):
    code, details, trailers = grpc_failure(daemon, "other")
    assert code == grpc.StatusCode.INTERNAL
    assert details == f"{GENERIC} (request {trailers['stagevisor-request-id']})"
    assert "hunter2" not in details and SECRET_TEXT not in details


def test_a_stage_error_reaches_an_http_client_in_the_openai_envelope(daemon):
    status, error = http_failure(daemon, "stage_error")
    assert status == 500 and error["type"] == "server_error"
    assert error["message"].startswith(f"stage 'refuser' failed: {WRITTEN} (request ")


def test_any_other_exception_reaches_an_http_client_only_as_the_generic_message(daemon):
    status, error = http_failure(daemon, "other")
    assert status == 500
    assert error["message"].startswith(f"{GENERIC} (request ") and "hunter2" not in error["message"]


def test_the_daemon_log_keeps_the_redacted_text_and_its_traceback(daemon):
    _, _, trailers = grpc_failure(daemon, "other")
    request_id = trailers["stagevisor-request-id"]
    assert poll_until(lambda: f"request {request_id} failed in stage 'refuser'" in daemon.log(), timeout=30)
    log = daemon.log()
    assert f"stage 'refuser' failed request {request_id}" in log and SECRET_TEXT in log
    assert "Traceback (most recent call last)" in log


def test_any_other_exception_after_audio_ends_a_grpc_stream_with_the_generic_message(daemon):
    code, details, trailers = grpc_failure(daemon, "after_audio")
    assert code == grpc.StatusCode.INTERNAL
    assert details == f"{GENERIC} (request {trailers['stagevisor-request-id']})"


def post_speech(daemon: DaemonProcess, path: str, body: dict) -> bytes:
    request = urllib.request.Request(
        daemon.http_url() + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def test_any_other_exception_after_audio_is_an_sse_error_event_with_the_generic_message(daemon):
    body = {"model": "refuser", "input": "hello", "response_format": "pcm", "stream_format": "sse"}
    text = post_speech(daemon, "/v1/audio/speech", {**body, "fail": "after_audio"}).decode()
    events = [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]
    assert events[-1]["error"]["message"].startswith(f"{GENERIC} (request ")
    assert "hunter2" not in text


def test_any_other_exception_is_a_batch_item_error_with_the_generic_message(daemon):
    item = {"model": "refuser", "input": "hello", "response_format": "pcm"}
    lines = post_speech(daemon, "/v1/audio/speech/batch", {"requests": [{**item, "fail": "stage_error"}, item]})
    results = sorted((json.loads(line) for line in lines.splitlines()), key=lambda r: r["index"])
    assert results[0]["error"]["message"].startswith(f"stage 'refuser' failed: {WRITTEN} (request ")
    assert results[1]["status"] == 500 and results[1]["error"]["message"].startswith(f"{GENERIC} (request ")
    assert b"hunter2" not in lines


def test_any_other_exception_ends_a_websocket_session_with_the_generic_message_and_request_id(daemon):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = daemon.http_url().replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "refuser", "fail": "after_audio"}))
        ws.send(json.dumps({"type": "text", "text": "Hello there."}))
        ws.send(json.dumps({"type": "end"}))
        events = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                message = ws.recv(timeout=60)
                if isinstance(message, str):
                    events.append(json.loads(message))
    request_id = events[0]["request_id"]
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["message"] == f"{GENERIC} (request {request_id})"
    assert closed.value.rcvd.code == 1011 and closed.value.rcvd.reason == f"{GENERIC} (request {request_id})"
    assert not any("hunter2" in json.dumps(e) for e in events)
