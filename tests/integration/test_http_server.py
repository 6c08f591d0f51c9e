"""The embedded uvicorn server on its own (a fake daemon behind the app), and `--http` errors of a real daemon."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.http.app import create_app
from stagevisor.supervisor.http.server import HttpAddressError, HttpServer, parse_http_address
from stagevisor.supervisor.http.settings import ConnectionLimits, HttpSettings
from stagevisor.supervisor.reports import StatusReport, TopologyReport
from tests.fakes import ScriptedHandle, audio_chunk, empty_topology, one_group_status
from tests.integration.daemon_helpers import ROOT, DaemonProcess, colocated_pipeline, daemon_env, poll_until


class FakeDaemon:
    """What create_app reads: a plan, a gateway with admission, status, topology, voices, the config's voice names."""

    def __init__(self, group_state: str = "READY", daemon_state: str = "SERVING") -> None:
        self.plan = SimpleNamespace(model="fake", model_path="test/fake")
        self.gateway = SimpleNamespace(
            admission=Admission(), limits=RequestLimits(), metrics=None, max_text_chars=DEFAULT_MAX_TEXT_CHARS
        )
        self.group_state = group_state
        self.daemon_state = daemon_state
        self.voice_names: dict[str, str] = {}

    def status(self) -> StatusReport:
        return one_group_status(self.group_state, self.daemon_state)

    def topology(self) -> TopologyReport:
        return empty_topology()

    def voices(self) -> list:
        return []


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_port_0_binds_a_free_port_and_ready_follows_the_groups():
    async def scenario():
        daemon = FakeDaemon(group_state="STARTING", daemon_state="STARTING")
        server = HttpServer(create_app(daemon), "127.0.0.1", 0)
        await server.start()
        try:
            assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
            status, body = await asyncio.to_thread(get, server.url + "/ready")
            assert status == 503 and body["groups_not_ready"] == [{"name": "pipeline", "state": "STARTING"}]
            assert (await asyncio.to_thread(get, server.url + "/health"))[0] == 200
            daemon.group_state, daemon.daemon_state = "READY", "SERVING"
            assert (await asyncio.to_thread(get, server.url + "/ready"))[0] == 200
            daemon.daemon_state = "STOPPING"
            assert (await asyncio.to_thread(get, server.url + "/ready"))[0] == 503
            second = HttpServer(server.server.config.app, "127.0.0.1", server.port)
            with pytest.raises(OSError):
                await second.start()
        finally:
            await server.stop()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "value,expected", [("127.0.0.1:8123", ("127.0.0.1", 8123)), ("[::1]:0", ("::1", 0)), ("none", None), ("off", None)]
)
def test_http_addresses(value, expected):
    assert parse_http_address(value) == expected


@pytest.mark.parametrize(
    "value", ["8123", "localhost", "127.0.0.1:http", "127.0.0.1:70000", ":80", "127.0.0.1:²", "127.0.0.1:８０"]
)
def test_malformed_http_addresses_are_refused(value):
    with pytest.raises(HttpAddressError, match="HOST:PORT"):
        parse_http_address(value)


def test_a_daemon_whose_http_port_is_taken_exits_1_and_says_which_option():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        with DaemonProcess(colocated_pipeline(), "--http", f"127.0.0.1:{port}") as daemon:
            assert daemon.wait_exit(timeout=60) == 1
            # The code and words of --listen's: before, `DAEMON_ERROR: ... (--http): Address already in use`.
            assert (
                f"ADDRESS_IN_USE: cannot listen on 127.0.0.1:{port} (--http): port {port} on 127.0.0.1 is already "
                "in use (another stagevisor daemon or another program); choose another --http, or --http none"
            ) in daemon.log()
    finally:
        taken.close()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--http", "8123"], "error: --http '8123' is not HOST:PORT"),
        (["--metrics", "127.0.0.1:²"], "error: --metrics '127.0.0.1:²' is not HOST:PORT"),
        (["--listen", "127.0.0.1:99999"], "error: --listen '127.0.0.1:99999': it is not HOST:PORT with a port from 0"),
        (["--listen", "unix:"], "error: --listen 'unix:': unix: needs a path after it"),
        (["--max-concurrent-requests", "-1"], "error: --max-concurrent-requests must be >= 0"),
        (["--queue-timeout", "nan"], "error: --queue-timeout must be a finite number"),
    ],
)
def test_serve_refuses_bad_http_and_admission_options_with_status_2(tmp_path, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "stagevisor", "serve", *args, "--admin-address", f"unix:{tmp_path}/admin.sock"],
        cwd=ROOT,
        env=daemon_env(tmp_path / "run"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert not (tmp_path / "run").exists()


def post(url: str, body: dict) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        error.read()
        return error.code


def test_speech_requests_are_metered_by_outcome_like_grpc_ones():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stagevisor.supervisor.dataplane.admission import AdmissionRejected
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

    async def scenario():
        daemon = FakeDaemon()
        daemon.gateway.metrics = metrics = DaemonMetrics("fake", {})

        async def submit(payload):
            if payload["text"] == "busy":
                raise AdmissionRejected("RESOURCE_EXHAUSTED", "BUSY", "busy", 1)
            if payload["text"] == "fail":  # fails before its first chunk
                failure = RequestFailed("INTERNAL", "the stage broke", request_id="r1")
                return ScriptedHandle(error=failure, request_id="r1")
            return ScriptedHandle([audio_chunk(2205, 22050, 0.0)] * 2, request_id="r1")

        daemon.gateway.submit = submit
        server = HttpServer(create_app(daemon), "127.0.0.1", 0)
        await server.start()
        try:
            url = server.url + "/v1/audio/speech"
            base = {"model": "fake", "response_format": "pcm"}
            for text, expected in (("hello", 200), ("busy", 429), ("fail", 500)):
                assert await asyncio.to_thread(post, url, {**base, "input": text}) == expected, text
            assert await asyncio.to_thread(post, url, {**base, "model": "other", "input": "x"}) == 404
        finally:
            await server.stop()
        text = generate_latest(metrics.registry).decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    samples = asyncio.run(scenario())
    model = ("model", "fake")

    def requests(outcome: str, code: str) -> float:
        return samples.get(("stagevisor_requests_total", frozenset({model, ("outcome", outcome), ("code", code)})), 0)

    assert requests("success", "OK") == 1
    assert requests("error", "RESOURCE_EXHAUSTED") == 1
    assert requests("error", "INTERNAL") == 1
    assert requests("error", "NOT_FOUND") == 1
    for name in (
        "stagevisor_time_to_first_audio_seconds_count",
        "stagevisor_real_time_factor_count",
        "stagevisor_audio_chunk_gap_seconds_count",
        "stagevisor_request_duration_seconds_count",
    ):
        assert samples[(name, frozenset({model}))] == 1, name
    assert samples[("stagevisor_audio_seconds_total", frozenset({model}))] == 0.2
    assert samples[("stagevisor_requests_in_flight", frozenset({model}))] == 0


def test_ready_stays_200_while_a_replicated_group_serves_through_its_other_replica():
    """One replica of two restarting leaves the daemon SERVING (grpc.health.v1 says so): /ready agrees, and
    still lists the replica that is not READY; a group with no READY worker at all is a 503."""
    from dataclasses import replace

    from stagevisor.supervisor.reports import GroupStatus

    class ReplicatedDaemon(FakeDaemon):
        def status(self) -> StatusReport:
            groups = (
                GroupStatus(name="pipeline", state="READY", pid=2, restarts=0),
                GroupStatus(name="vocoder/0", state=self.group_state, pid=0, restarts=1),
                GroupStatus(name="vocoder/1", state="READY", pid=4, restarts=0),
            )
            base = one_group_status("READY", self.daemon_state)
            ready = 2 + (self.group_state == "READY")
            return replace(base, groups=groups, groups_ready=2, groups_total=2, workers_ready=ready, workers_total=3)

    async def scenario():
        daemon = ReplicatedDaemon(group_state="BACKOFF", daemon_state="SERVING")
        server = HttpServer(create_app(daemon), "127.0.0.1", 0)
        await server.start()
        try:
            status, body = await asyncio.to_thread(get, server.url + "/ready")
            assert status == 200 and body["ready"] is True
            assert body["groups_not_ready"] == [{"name": "vocoder/0", "state": "BACKOFF"}]
            assert (body["groups_ready"], body["groups_total"], body["workers_ready"], body["workers_total"]) == (
                2,
                2,
                2,
                3,
            )
            daemon.daemon_state = "DEGRADED"  # a group with no READY worker
            assert (await asyncio.to_thread(get, server.url + "/ready"))[0] == 503
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_stop_cuts_a_response_whose_client_reads_nothing_without_an_asgi_error(monkeypatch, caplog):
    """A client that stopped reading keeps its response open past the drain (its writes wait on a full socket).

    1. An app streams audio-sized chunks for ever; a client reads the first bytes through a 4 KiB buffer, then
       nothing.
    2. The server stops. After its grace period the connection is cut, as if the client had gone: the app's
       send fails and it ends; uvicorn never has to cancel it, which it logs as an ERROR "Exception in ASGI
       application" with a CancelledError traceback (one per stalled client, at every such shutdown).
    """
    import stagevisor.supervisor.http.server as server_module

    monkeypatch.setattr(server_module, "GRACEFUL_SHUTDOWN", 1)
    from starlette.responses import StreamingResponse

    ended: list[str] = []

    async def chunks():
        while True:
            await asyncio.sleep(0)  # audio comes from the pipeline: each chunk is awaited
            yield b"\0" * 65536

    async def endless(scope, receive, send) -> None:
        assert scope["type"] == "http"
        # As the speech response does: the body streams while another task waits for the client's disconnect.
        await StreamingResponse(chunks(), media_type="audio/pcm")(scope, receive, send)
        ended.append("returned")

    async def scenario() -> bytes:
        server = HttpServer(endless, "127.0.0.1", 0)
        await server.start()
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it advertises
        client.settimeout(10)
        try:
            client.connect(("127.0.0.1", server.port))
            client.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert (await asyncio.to_thread(client.recv, 100)).startswith(b"HTTP/1.1 200")
            await asyncio.wait_for(server.stop(), timeout=30)
            return await asyncio.to_thread(_read_to_the_end, client)
        finally:
            client.close()

    with caplog.at_level("INFO"):
        tail = asyncio.run(scenario())
    assert tail == b"closed", tail
    assert ended == ["returned"], "the response ended as for a client that went away"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not errors, errors
    assert "1 HTTP connection still open" in caplog.text and "reads nothing" in caplog.text


def _read_to_the_end(client: socket.socket) -> bytes:
    """b"closed" once the server closed or reset the connection, reading whatever it still holds."""
    try:
        while client.recv(1 << 20):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return b"still open"
    return b"closed"


def raw_exchange(port: int, *pieces: bytes, wait: float = 10.0) -> tuple[bytes, bool]:
    """Send `pieces` on one connection and read until the server closes it or `wait` passes: (what came back,
    whether the server closed the connection). A piece the server no longer takes (it closed) ends the sending."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:
                break
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:
            return answer, False
        except ConnectionResetError:
            pass
        return answer, True


def served_raw(scenario, settings: HttpSettings | None = None) -> None:
    """Run `scenario(port)` in a thread against the embedded server (with `settings`) and a fake daemon behind it."""

    async def serve() -> None:
        server = HttpServer(create_app(FakeDaemon()), "127.0.0.1", 0, settings=settings)
        await server.start()
        try:
            await asyncio.to_thread(scenario, server.port)
        finally:
            await server.stop()

    asyncio.run(serve())


def envelope(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def test_an_absolute_form_target_is_served_as_its_path_by_the_real_server():
    """RFC 9112 section 3.2.2: uvicorn passed `http://127.0.0.1:PORT/health` on as the path, a 404."""

    def scenario(port: int) -> None:
        target = f"GET http://127.0.0.1:{port}/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        status, _, body = envelope(raw_exchange(port, target.encode())[0])
        assert (status, body["status"]) == (200, "ok")

    served_raw(scenario)


def test_a_malformed_request_or_an_oversized_head_is_answered_in_the_apis_envelope():
    """uvicorn answered both 400 text/plain `Invalid HTTP request received.`; a head past h11's 16 KiB is 431."""

    def scenario(port: int) -> None:
        # A head that has not ended by 40 KB (h11 judges the size of a head still incomplete: one that arrives
        # whole in one read is parsed whatever its size).
        headers = b"".join(b"X-Filler-%d: %s\r\n" % (i, b"a" * 4000) for i in range(10))
        answer, closed = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", headers)
        status, head, body = envelope(answer)
        assert (status, head["content-type"], body["error"]["code"]) == (
            431,
            "application/json",
            "request_header_fields_too_large",
        )
        assert closed
        answer, closed = raw_exchange(port, b"GET /health HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n")
        assert answer.endswith(b'"code":"invalid_http_request"}}')  # rendered as the API's other answers are
        status, head, body = envelope(answer)
        assert (status, body["error"]["code"], head["connection"]) == (400, "invalid_http_request", "close")
        assert closed

    served_raw(scenario)


def test_a_plain_get_of_the_websocket_route_is_426_and_the_connection_serves_on():
    def scenario(port: int) -> None:
        plain = b"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        after = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        answer, _ = raw_exchange(port, plain + after)
        first, _, rest = answer.partition(b"}}")
        status, headers, body = envelope(first + b"}}")
        assert (status, headers["upgrade"], body["error"]["code"]) == (426, "websocket", "upgrade_required")
        assert rest.startswith(b"HTTP/1.1 200 OK"), rest[:200]

    served_raw(scenario)


def test_a_body_framed_by_both_content_length_and_transfer_encoding_is_refused_and_the_connection_closed():
    """RFC 9112 section 6.3 (request smuggling): h11 read the body by Transfer-Encoding, answered, and kept the
    connection, so the bytes after the chunked body were served as a second request."""

    def scenario(port: int) -> None:
        smuggled = (
            b"POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        )
        answer, closed = raw_exchange(port, smuggled)
        status, headers, body = envelope(answer)
        assert (status, headers["connection"], body["error"]["code"]) == (400, "close", "invalid_http_request")
        assert closed and answer.count(b"HTTP/1.1 ") == 1

    served_raw(scenario)


@pytest.mark.parametrize("coding", [b"gzip", b"gzip, chunked", b"chunked\r\nTransfer-Encoding: chunked"])
def test_a_transfer_coding_the_server_does_not_read_is_501_and_the_connection_closed(coding):
    """RFC 9112 section 6.1: a server that receives a transfer coding it does not understand should answer 501;
    h11 refuses any but chunked, and it was answered 400 `invalid_http_request` as a malformed request."""

    def scenario(port: int) -> None:
        request = b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: " + coding + b"\r\n\r\n"
        answer, closed = raw_exchange(port, request)
        status, headers, body = envelope(answer)
        assert (status, headers["connection"], body["error"]["code"]) == (501, "close", "unsupported_transfer_encoding")
        assert "chunked" in body["error"]["message"] and closed

    served_raw(scenario)


def test_a_request_cut_short_by_its_deadline_is_answered_408_before_the_connection_closes():
    """RFC 9110 section 15.5.9: a server that did not receive a complete request in the time it waits may answer
    408 and close. The head and body deadlines closed the connection without a word, so a client (or a proxy in
    front) could not tell a deadline from a crash. A connection that sent nothing is closed without one: there is
    no request to answer, and a 408 on it could be taken for the answer to a request sent as it arrives."""

    def scenario(port: int) -> None:
        partial_head = b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        short_body = partial_head + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"input": '
        for request, phase in ((partial_head, "request line and headers"), (short_body, "body")):
            answer, closed = raw_exchange(port, request, wait=10.0)
            status, headers, body = envelope(answer)
            assert (status, headers["connection"], body["error"]["code"]) == (408, "close", "request_timeout")
            assert phase in body["error"]["message"], body
            assert closed
        assert raw_exchange(port, b"", wait=10.0) == (b"", True)

    served_raw(scenario, HttpSettings(limits=ConnectionLimits(header_timeout=0.5, body_timeout=0.5)))


def test_at_the_cap_of_busy_connections_health_probes_are_answered_and_other_requests_get_503():
    """Every connection under the cap busy with a request (streams, say): a new connection was closed at once,
    so a load balancer's `GET /health` failed for a healthy, busy daemon and took it out of rotation. Now
    PROBE_RESERVE connections past the cap answer a probe, and any other request 503 with Retry-After; past
    those, a newcomer is still closed at once."""
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from stagevisor.supervisor.http.connections import PROBE_RESERVE

    cap = 2
    held: list[asyncio.Event] = []
    entered = 0

    async def hold(request):
        nonlocal entered
        release = asyncio.Event()
        held.append(release)
        entered += 1
        await release.wait()
        return PlainTextResponse("released")

    def scenario(port: int, loop: asyncio.AbstractEventLoop) -> None:
        busy = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
        for sock in busy:
            sock.sendall(b"GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        poll_until(lambda: entered == cap, timeout=10, message="the cap's connections busy")

        for probe in (b"GET /health", b"HEAD /ready", b"GET http://127.0.0.1/health", b"GET /health"):
            answer, closed = raw_exchange(port, probe + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
            assert b"connection: close\r\n" in answer.lower() and closed
        answer, closed = raw_exchange(port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, body = envelope(answer)
        assert (status, headers["retry-after"], body["error"]["code"]) == (503, "1", "too_many_connections")
        assert closed
        handshake = (
            b"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade"
            b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        answer, closed = raw_exchange(port, handshake)  # a session would bypass the probes-only app
        assert envelope(answer)[0] == 503 and closed

        # The reserve taken by connections that send nothing: the next newcomer is closed without a word.
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(PROBE_RESERVE)]
        time.sleep(0.2)  # the server takes them in before the next one
        assert raw_exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") == (b"", True)
        for sock in idle:
            sock.close()
        loop.call_soon_threadsafe(lambda: [release.set() for release in held])
        for sock in busy:
            sock.settimeout(10)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
            sock.close()

    async def serve() -> None:
        app = create_app(FakeDaemon(), extra_routes=[Route("/hold", hold, methods=["GET"])])
        server = HttpServer(app, "127.0.0.1", 0, max_connections=cap)
        await server.start()
        try:
            await asyncio.to_thread(scenario, server.port, asyncio.get_running_loop())
        finally:
            await server.stop()

    asyncio.run(serve())
