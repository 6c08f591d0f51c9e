"""Admission control on a real daemon, over HTTP and gRPC together: busy, queue timeout, draining.

The pipeline is one test stage (tests/integration/http_stages.py) that marks
every request it receives and holds it until the test opens a gate, so what
is running, queued and rejected is decided by the test, not by timing.
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
from stagevisor.supervisor.dataplane.synthesis import to_pcm16
from tests.integration.daemon_helpers import DaemonProcess, make_plan, poll_until
from tests.integration.http_stages import SAMPLE_RATE, gate_audio

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

GATE = "tests.integration.http_stages:make_gate"


def gate_daemon(*limits: str) -> DaemonProcess:
    plan = make_plan("gate", [("gate", "pipeline", None, None)], factories={"gate": GATE})
    return DaemonProcess(plan, "--http", "127.0.0.1:0", *limits)


@pytest.fixture
def gate_dir():
    with tempfile.TemporaryDirectory(prefix="svgate", dir="/tmp") as path:
        yield Path(path)


def seen(gate_dir: Path) -> int:
    return len(list(gate_dir.glob("seen-*")))


def http_speech(url: str, gate_dir: Path) -> tuple[int, dict[str, str], bytes]:
    import http.client

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=90)
    # At the gate's own rate (pcm is 24 kHz unless asked), so the bytes equal what gRPC streams.
    body = json.dumps(
        {
            "model": "gate",
            "input": "hold",
            "response_format": "pcm",
            "sample_rate": SAMPLE_RATE,
            "gate_dir": str(gate_dir),
        }
    )
    try:
        connection.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def grpc_speech(address: str, gate_dir: Path) -> tuple[str, bytes, dict[str, str]]:
    """(status name, pcm, trailing metadata) of one Synthesize call."""
    with grpc.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        call = stub.Synthesize(
            synthesis_pb2.SynthesizeRequest(text="hold", options={"gate_dir": str(gate_dir)}), timeout=90
        )
        pcm = b""
        try:
            for chunk in call:
                pcm += chunk.pcm
        except grpc.RpcError as error:
            return error.code().name, pcm, dict(error.trailing_metadata() or ())
        return "OK", pcm, {}


FULL_AUDIO = to_pcm16(gate_audio())


def test_a_burst_of_four_times_the_limit_gets_clean_rejections_and_no_worker_sees_them(gate_dir):
    """
    1. limit 2 running, no queue; 4 HTTP and 4 gRPC requests arrive at once;
    2. 6 are rejected at once (429 + Retry-After / RESOURCE_EXHAUSTED) while 2 wait at the gate;
    3. only 2 requests ever reached the worker; opening the gate gives them their full audio.
    """
    with gate_daemon("--max-concurrent-requests", "2", "--max-queued-requests", "0") as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        results: dict[str, list] = {"http": [], "grpc": []}
        lock = threading.Lock()

        def one(kind: str) -> None:
            result = http_speech(url, gate_dir) if kind == "http" else grpc_speech(daemon.listen, gate_dir)
            with lock:
                results[kind].append(result)

        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(one, kind) for kind in ["http", "grpc"] * 4]
            poll_until(
                lambda: len(results["http"]) + len(results["grpc"]) == 6,
                timeout=60,
                message="6 rejections while 2 requests are held",
            )
            assert seen(gate_dir) == 2
            (gate_dir / "open").touch()
            for future in futures:
                future.result(timeout=90)

        http_ok = [r for r in results["http"] if r[0] == 200]
        http_busy = [r for r in results["http"] if r[0] == 429]
        grpc_ok = [r for r in results["grpc"] if r[0] == "OK"]
        grpc_busy = [r for r in results["grpc"] if r[0] == "RESOURCE_EXHAUSTED"]
        assert len(http_ok) + len(grpc_ok) == 2 and len(http_busy) + len(grpc_busy) == 6
        assert all(r[2] == FULL_AUDIO for r in http_ok) and all(r[1] == FULL_AUDIO for r in grpc_ok)
        for _status, headers, body in http_busy:
            assert int(headers["retry-after"]) >= 1
            error = json.loads(body)["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == "busy"
        for _, _, trailers in grpc_busy:
            assert int(trailers["grpc-retry-pushback-ms"]) >= 1000
        assert seen(gate_dir) == 2, "a rejected request reached the worker"
        assert poll_until(
            lambda: (daemon.admin_status() or {}).get("in_flight") == 0, timeout=30, message="nothing in flight"
        )


def test_a_queued_request_that_waits_past_the_queue_timeout_gets_429(gate_dir):
    """
    1. limit 1 running, 1 queued, queue timeout 0.5 s: the first request holds the slot;
    2. the second waits in the queue, a third is refused at once (busy);
    3. the second ends with 429 queue_timeout; neither of them reached the worker.
    """
    with gate_daemon(
        "--max-concurrent-requests", "1", "--max-queued-requests", "1", "--queue-timeout", "0.5"
    ) as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        with ThreadPoolExecutor(2) as pool:
            holder = pool.submit(http_speech, url, gate_dir)
            poll_until(lambda: seen(gate_dir) == 1, timeout=30, message="the first request at the gate")
            queued = pool.submit(http_speech, url, gate_dir)
            poll_until(lambda: daemon_queue(url) == 1, timeout=30, message="the second request queued")
            status, _, body = http_speech(url, gate_dir)
            assert status == 429 and json.loads(body)["error"]["code"] == "busy"
            status, headers, body = queued.result(timeout=60)
            assert status == 429 and json.loads(body)["error"]["code"] == "queue_timeout"
            assert int(headers["retry-after"]) >= 1
            assert seen(gate_dir) == 1
            (gate_dir / "open").touch()
            status, _, body = holder.result(timeout=60)
            assert status == 200 and body == FULL_AUDIO


def daemon_queue(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/topology", timeout=10) as response:
        return json.load(response)["admission"]["queued"]


def test_queued_clients_that_leave_free_their_place_and_draining_answers_503(gate_dir):
    """
    1. limit 1 running: one request is held at the gate; a client queues behind it and hangs up,
       and the queue is empty again (its timeout, 30 s, has not passed);
    2. another client queues; the daemon gets SIGTERM: the queued one gets 503 at once, new HTTP
       requests 503, new gRPC ones UNAVAILABLE, and /ready 503;
    3. the held request still completes once the gate opens, then the daemon exits 0.
    """
    import socket
    import urllib.error
    import urllib.request

    with gate_daemon("--drain-timeout", "60", "--max-concurrent-requests", "1", "--max-queued-requests", "4") as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(http_speech, url, gate_dir)
            poll_until(lambda: seen(gate_dir) == 1, timeout=30, message="the request at the gate")
            parts = urlsplit(url)
            leaver = socket.create_connection((parts.hostname, parts.port), timeout=30)
            body = json.dumps({"model": "gate", "input": "x", "gate_dir": str(gate_dir)}).encode()
            leaver.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            poll_until(lambda: daemon_queue(url) == 1, timeout=30, message="the leaver queued")
            leaver.close()
            poll_until(lambda: daemon_queue(url) == 0, timeout=20, message="the leaver's place freed")

            queued = pool.submit(http_speech, url, gate_dir)
            poll_until(lambda: daemon_queue(url) == 1, timeout=30, message="a request queued")
            daemon.proc.send_signal(signal.SIGTERM)
            status, _, body = queued.result(timeout=30)
            assert status == 503 and json.loads(body)["error"]["code"] == "draining"
            status, headers, body = http_speech(url, gate_dir)
            assert status == 503 and json.loads(body)["error"]["code"] == "draining"
            assert grpc_speech(daemon.listen, gate_dir)[0] == "UNAVAILABLE"
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(url + "/ready", timeout=10)
            assert caught.value.code == 503
            assert seen(gate_dir) == 1
            (gate_dir / "open").touch()
            status, _, body = held.result(timeout=60)
            assert status == 200 and body == FULL_AUDIO
        assert daemon.wait_exit(timeout=60) == 0


def test_a_failure_after_the_first_audio_cuts_the_body_or_sends_an_sse_error(gate_dir):
    """The 200 is already out when the stage fails: chunked audio ends without its last chunk; SSE gets an event."""
    import http.client

    (gate_dir / "open").touch()
    with gate_daemon() as daemon:
        daemon.wait_serving()
        parts = urlsplit(daemon.http_url())
        for stream_format in ("audio", "sse"):
            connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
            body = json.dumps(
                {
                    "model": "gate",
                    "input": "x",
                    "response_format": "pcm",
                    "stream_format": stream_format,
                    "gate_dir": str(gate_dir),
                    "fail_mid_stream": True,
                }
            )
            connection.request("POST", "/v1/audio/speech", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200
            if stream_format == "audio":
                with pytest.raises(http.client.IncompleteRead):
                    response.read()
            else:
                events = [
                    json.loads(line[6:]) for line in response.read().decode().splitlines() if line.startswith("data: ")
                ]
                assert events[0]["type"] == "speech.audio.delta"
                assert events[-1]["type"] == "error" and events[-1]["error"]["type"] == "server_error"
                # A code, the stage and a request id; the executor's own text stays in the daemon log.
                message = events[-1]["error"]["message"]
                assert "failed on purpose" not in message and "(request " in message, message
            connection.close()
        # The cut is logged once, by stagevisor, with the request id; uvicorn's own ERROR about it is not repeated.
        log = daemon.log()  # both lines come before the connection closes
        assert log.count("failed mid-stream") == 2 and "without completing response" not in log, log


def test_a_batch_of_20_under_admission_limits_returns_20_results_each_ok_or_a_coded_429(gate_dir):
    """
    1. limit 2 running and 2 queued; one batch of 20 requests arrives;
    2. 16 items come back at once as 429 rate_limit_error (admission per item), while 2 run and 2 wait;
    3. opening the gate, the other 4 come back 200 with their whole audio as a WAV of exact length.
    """
    import base64
    import http.client
    import io
    import wave

    with gate_daemon("--max-concurrent-requests", "2", "--max-queued-requests", "2", "--queue-timeout", "60") as daemon:
        daemon.wait_serving()
        parts = urlsplit(daemon.http_url())
        item = {"model": "gate", "input": "hold", "response_format": "wav", "gate_dir": str(gate_dir)}
        body = json.dumps({"requests": [item] * 20})
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=90)
        try:
            connection.request(
                "POST", "/v1/audio/speech/batch", body=body, headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            assert response.status == 200 and response.getheader("content-type") == "application/x-ndjson"
            lines = [json.loads(response.readline()) for _ in range(16)]
            assert all(r["status"] == 429 and r["error"]["type"] == "rate_limit_error" for r in lines), lines
            poll_until(lambda: seen(gate_dir) == 2, timeout=60, message="2 items at the gate")
            (gate_dir / "open").touch()
            lines += [json.loads(line) for line in response.read().splitlines()]
        finally:
            connection.close()
        assert seen(gate_dir) == 4  # the 16 rejected never reached the worker
    assert sorted(r["index"] for r in lines) == list(range(20))
    ok = [r for r in lines if r["status"] == 200]
    assert len(ok) == 4 and all(r["error"]["code"] for r in lines if r["status"] != 200)
    for result in ok:
        with wave.open(io.BytesIO(base64.b64decode(result["audio"]))) as wav:
            assert wav.getframerate() == SAMPLE_RATE
            assert wav.getnframes() == gate_audio().size  # exact sizes: the length was known


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
def test_a_websocket_cancel_or_disconnect_releases_its_request_slot_at_once(gate_dir, how):
    """
    1. limit 1 running, no queue; a WebSocket session's first sentence is held at the gate;
    2. meanwhile an HTTP request is refused (429): the session holds the one slot;
    3. the client cancels (or drops the connection): nothing is in flight soon after, and the next HTTP
       request is admitted and served while the session's sentence never completes.
    """
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with gate_daemon("--max-concurrent-requests", "1", "--max-queued-requests", "0") as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        with connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30, proxy=None) as ws:
            ws.send(json.dumps({"type": "start", "model": "gate", "gate_dir": str(gate_dir)}))
            ws.send(json.dumps({"type": "text", "text": "Hold this sentence. And"}))
            poll_until(lambda: seen(gate_dir) == 1, timeout=60, message="the session's sentence at the gate")
            assert http_speech(url, gate_dir)[0] == 429
            if how == "cancel":
                ws.send(json.dumps({"type": "cancel"}))
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=30)
                assert closed.value.rcvd.code == 1000
            else:
                ws.socket.close()
        poll_until(lambda: (daemon.admin_status() or {}).get("in_flight") == 0, timeout=10, message="0 in flight")
        (gate_dir / "open").touch()
        status, _, body = http_speech(url, gate_dir)
        assert status == 200 and body == to_pcm16(gate_audio())
        assert seen(gate_dir) == 2
