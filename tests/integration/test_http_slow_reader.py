"""POST /v1/audio/speech to a client that reads slowly: served to the end while it reads, cut once it stops.

Before: the idle timeout bounded each write to the client as a whole, and one write waits until the buffers in
front of the client drain (megabytes of socket buffer behind a real client), so a client reading 20 KB/s all
along was cut after --stream-idle-timeout (60 s) with a short 200. Here the sizes shrink with the timeout (1 s):
the client advertises a small MSS and receive window, so the daemon's socket buffers about 100 KB, and a write of a
three-second audio chunk (288 KB) waits about twice the timeout on a client reading 150 KB/s.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import time

import pytest

from tests.integration.daemon_helpers import ServeProcess, poll_until, still_open
from tests.integration.raw_websocket import masked_text_frame
from tests.integration.limit_stages import SAMPLE_RATE, pipeline_config

IDLE_TIMEOUT = 1
SECONDS = 9
CHUNK = 3
"""Seconds of audio asked for, in chunks of CHUNK seconds: 864 KB of 16-bit PCM at the source's rate, three writes
of 288 KB (with two, the second write leaves whole after the cut, and a cut body would read as a whole one)."""
READ_RATE = 150_000
"""Bytes per second the slow client reads, in small steps: it takes something every few milliseconds."""
READ_STEP = 2048


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    config = tmp_path_factory.mktemp("slow-reader") / "limits.yaml"
    config.write_text(pipeline_config("limits-test"))
    with ServeProcess(
        "--config",
        str(config),
        "--http",
        "127.0.0.1:0",
        "--stream-idle-timeout",
        str(IDLE_TIMEOUT),
        "--max-audio-seconds",
        "3600",
    ) as process:
        process.wait_serving()
        yield process


def small_window_client(daemon: ServeProcess) -> socket.socket:
    """A connection to the daemon's HTTP port advertising a small receive window and MSS (set before connect)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1024)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", int(daemon.http_url().rsplit(":", 1)[1])))
    return sock


def open_speech(daemon: ServeProcess, seconds: int) -> tuple[socket.socket, dict[str, str], bytes]:
    """POST a request for `seconds` of PCM from a `small_window_client`; the socket, the response's headers and
    what came with them."""
    sock = small_window_client(daemon)
    body = json.dumps(
        {
            "model": "limits-test",
            "input": "Long.",
            "response_format": "pcm",
            "sample_rate": SAMPLE_RATE,
            "seconds": str(seconds),
            "chunk": str(CHUNK),
        }
    ).encode()
    # HTTP/1.0: the body ends where the daemon closes the connection, so a cut body reads as a short one.
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    received = b""
    while b"\r\n\r\n" not in received:
        piece = sock.recv(READ_STEP)
        assert piece, f"the daemon closed before its answer's head: {received!r}"
        received += piece
    head, _, rest = received.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    assert status.startswith("HTTP/1.1 200"), head
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    return sock, headers, rest


def read_to_end(sock: socket.socket, rate: float | None = None, until: bytes | None = None) -> bytes:
    """The rest of the body (up to `until`, when given), at most `rate` bytes per second (None: as it comes)."""
    started, body = time.monotonic(), b""
    while (until is None or until not in body) and (piece := sock.recv(READ_STEP)):
        body += piece
        if rate is not None:
            time.sleep(max(0.0, len(body) / rate - (time.monotonic() - started)))
    return body


def cancelled(daemon: ServeProcess, request_id: str) -> bool:
    return any(request_id in line and "(--stream-idle-timeout)" in line for line in daemon.log().splitlines())


@pytest.mark.slow  # reads for six times the idle timeout
def test_a_client_reading_slowly_but_steadily_gets_the_whole_stream(daemon):
    """
    1. a client asks for 9 s of audio (864 KB) and reads it at 150 KB/s, so single writes wait past the 1 s timeout
    2. it gets every byte, and the daemon cancelled nothing
    """
    sock, headers, first = open_speech(daemon, SECONDS)
    with sock:
        received = len(first + read_to_end(sock, READ_RATE))
    assert received == SECONDS * SAMPLE_RATE * 2
    assert not cancelled(daemon, headers["x-request-id"])


@pytest.mark.slow  # waits out the idle timeout
def test_a_client_that_stops_reading_is_cut_at_the_idle_timeout_and_its_request_freed(daemon):
    """
    1. a client asks for endless audio, reads the head of the answer, then nothing
    2. the daemon cancels the request after the idle timeout, saying why, and has nothing in flight
    3. the daemon resets the connection while the client still reads nothing, and reading finds it reset

    Before 3: the connection was closed after a flush of what was buffered for the client, so it stayed open
    (a descriptor, a place under the connection cap that is never evicted) until the client read or left.
    """
    sock, headers, _ = open_speech(daemon, 3600)
    with sock:
        poll_until(lambda: cancelled(daemon, headers["x-request-id"]), timeout=30, message="the idle request cancelled")
        poll_until(lambda: (daemon.admin_status() or {}).get("in_flight") == 0, timeout=30, message="nothing in flight")
        poll_until(lambda: not still_open(sock), timeout=10, message="the stalled connection reset")
        with pytest.raises(ConnectionResetError):
            read_to_end(sock)


@pytest.mark.slow  # reads for six times the idle timeout
def test_a_websocket_client_reading_slowly_but_steadily_hears_its_whole_sentence(daemon):
    """The speech WebSocket's frames are bounded by the same rule:

    1. a session asks for a sentence of 9 s of audio and reads it at 150 KB/s
    2. it gets the sentence's audio.done and the session's done, and the daemon cancelled nothing
    """
    sock = small_window_client(daemon)
    with sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            (
                "GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer:  # before any message: what came with the upgrade would be lost
            answer += sock.recv(1)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        start = {
            "type": "start",
            "model": "limits-test",
            "sample_rate": SAMPLE_RATE,
            "seconds": str(SECONDS),
            "chunk": str(CHUNK),
        }
        messages = [start, {"type": "text", "text": "Long."}, {"type": "end"}]
        sock.sendall(b"".join(masked_text_frame(json.dumps(message)) for message in messages))
        received = read_to_end(sock, READ_RATE, until=b'"type":"done"')
    assert b'"type":"audio.done"' in received and b'"type":"done"' in received
    request_id = re.search(rb'"request_id":"(\w+)"', received)
    assert request_id is not None and not cancelled(daemon, request_id.group(1).decode())
