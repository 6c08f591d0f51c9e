"""Speech WebSocket sessions that go wrong early: a client that stops reading mid-sentence loses its sentence
after --stream-idle-timeout while everyone else is served, and a bad start message is answered at once.

Before: the session's writes had no bound (a POST's body writes had one), so a client that stopped reading held
its request slot for ever, and a few such clients shut everyone else out with 429s; the start message was
checked only with the first sentence.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time

import pytest

from tests.integration.raw_websocket import masked_text_frame
from tests.integration.daemon_helpers import ServeProcess, poll_until, still_open
from tests.integration.limit_stages import pipeline_config

CONFIG = pipeline_config("limits-test")
IDLE_TIMEOUT = 1
SAMPLE_RATE = 48_000
"""The source's rate: 96 KB of PCM per audio second, so a 30 s sentence is far past what socket buffers hold."""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    config = tmp_path_factory.mktemp("stalled") / "limits.yaml"
    config.write_text(CONFIG)
    with ServeProcess(
        "--config",
        str(config),
        "--http",
        "127.0.0.1:0",
        "--stream-idle-timeout",
        str(IDLE_TIMEOUT),
        "--max-audio-seconds",
        "3600",
        "--max-concurrent-requests",
        "1",
        "--queue-timeout",
        "60",
    ) as process:
        process.wait_serving()
        yield process


def speak(url: str, text: str = "Hello.") -> list:
    from websockets.sync.client import connect

    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "limits-test", "sample_rate": SAMPLE_RATE}))
        ws.send(json.dumps({"type": "text", "text": text}))
        ws.send(json.dumps({"type": "end"}))
        return list(ws)


def silent_session(port: int, messages: list[dict]) -> socket.socket:
    """A WebSocket client that reads the handshake's answer, sends `messages`, then reads nothing more, through a
    4 KiB receive buffer (a client library would read ahead)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window it advertises
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(1)  # a byte at a time: nothing past the handshake's answer is read
    assert answer.startswith(b"HTTP/1.1 101"), answer
    sock.sendall(b"".join(masked_text_frame(json.dumps(message)) for message in messages))
    return sock


@pytest.mark.slow  # waits out the idle timeout
def test_a_websocket_client_that_stops_reading_loses_its_slot_after_the_idle_timeout(daemon):
    """
    1. a client asks for a sentence of 30 s of audio at 48 kHz (2.9 MB) and reads nothing
    2. the daemon shows its sentence in flight, then ends it after the idle timeout, saying why in its log
    3. with one request slot in all, a normal session is then served
    4. the stalled session's connection is reset while its client still reads nothing (it stayed open, waiting
       to flush the audio left for it, until the client read or left)
    """
    url = daemon.http_url()
    start = {"type": "start", "model": "limits-test", "sample_rate": SAMPLE_RATE, "seconds": "30"}
    stalled = silent_session(int(url.rsplit(":", 1)[1]), [start, {"type": "text", "text": "Long."}, {"type": "end"}])
    with stalled:
        seen = threading.Event()

        def in_flight_then_released() -> bool:
            count = (daemon.admin_status() or {}).get("in_flight", 0)
            if count:
                seen.set()
            return seen.is_set() and count == 0

        poll_until(in_flight_then_released, timeout=60, interval=0.05, message="the stalled sentence released")
        frames = speak(url.replace("http://", "ws://") + "/v1/audio/speech/stream")
        assert json.loads(frames[-1])["type"] == "done"
        assert sum(len(f) for f in frames if isinstance(f, bytes)) == 2 * SAMPLE_RATE
        poll_until(lambda: not still_open(stalled), timeout=10, message="the stalled session's connection reset")
    assert f"read no audio for {IDLE_TIMEOUT} s (--stream-idle-timeout)" in daemon.log()


@pytest.mark.parametrize(
    ("start", "code"),
    [
        ({"voice": 7}, "invalid_type"),
        ({"speed": 9}, "invalid_value"),
        ({"seconds": {"nested": 1}}, "invalid_type"),
    ],
)
def test_a_bad_start_message_is_refused_before_any_text(daemon, start, code):
    """Before: the start message was first checked with the first sentence; a session that then sent only
    `end` got `done`, and never heard what was wrong."""
    from websockets.exceptions import ConnectionClosedError
    from websockets.sync.client import connect

    url = daemon.http_url().replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        ws.send(json.dumps({"type": "start", "model": "limits-test", **start}))
        ws.send(json.dumps({"type": "end"}))
        messages = []
        with pytest.raises(ConnectionClosedError):
            while True:
                messages.append(ws.recv(timeout=30))
        close = ws.close_code
    error = json.loads(messages[-1])
    assert error["type"] == "error", messages
    assert error["error"]["code"] == code, error
    assert close == 1008


def test_a_cancel_after_end_stops_the_session(daemon):
    """Before: the session read nothing after `end`, so a voice app that sent `end` with the last of a reply and
    then cancelled (its user pressed stop) heard the whole reply; now the cancel closes the session at once."""
    from websockets.exceptions import ConnectionClosedOK
    from websockets.sync.client import connect

    url = daemon.http_url().replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(url, open_timeout=30, proxy=None) as ws:
        start = {
            "type": "start",
            "model": "limits-test",
            "sample_rate": SAMPLE_RATE,
            "seconds": "30",
            "interval": "0.2",
        }
        for message in (start, {"type": "text", "text": "Long."}, {"type": "end"}):
            ws.send(json.dumps(message))
        audio = 0
        while not audio:
            frame = ws.recv(timeout=30)
            audio += len(frame) if isinstance(frame, bytes) else 0
        ws.send(json.dumps({"type": "cancel"}))
        began = time.monotonic()
        with pytest.raises(ConnectionClosedOK):
            while True:
                frame = ws.recv(timeout=30)
                audio += len(frame) if isinstance(frame, bytes) else 0
        assert ws.close_code == 1000 and time.monotonic() - began < 10
    assert audio < 5 * SAMPLE_RATE * 2  # far from the 30 s asked for
