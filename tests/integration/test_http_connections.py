"""The HTTP server under slow clients: header and body deadlines, the connection cap, the Host check.

Scenario of the audit: a daemon limited to 256 descriptors, 200 connections that trickle their request
head a byte a second or stop short of their body. Each is closed within its deadline, the daemon's
descriptors come back, and ordinary requests are answered all along.

"Within its deadline" is judged by what the daemon did, not by the test's clock: on a loaded machine the
daemon may not run at all for many seconds, and a deadline that fires late is still the deadline. Waits on
the clock are bounds against a hang only, far above such a stall.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.integration.daemon_helpers import DaemonProcess, closed_by_server, descriptor_limited_daemon, poll_until

HEADER_TIMEOUT = 3.0
BODY_TIMEOUT = 3.0
NOFILE = 256
SLOW = 200
ANSWER_WAIT = 60.0
"""How long an ordinary request may go without a byte: a bound against a hang, not a latency claim."""


def slow_daemon(*extra: str) -> DaemonProcess:
    return descriptor_limited_daemon(
        "slow-clients",
        NOFILE,
        "--http",
        "127.0.0.1:0",
        "--http-header-timeout",
        str(HEADER_TIMEOUT),
        "--http-body-timeout",
        str(BODY_TIMEOUT),
        *extra,
    )


def get(url: str, host: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_WAIT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def speech(url: str) -> tuple[int, int]:
    """One ordinary speech request: (status, bytes of audio)."""
    body = json.dumps({"model": "slow-clients", "input": "an ordinary request", "response_format": "pcm"}).encode()
    request = urllib.request.Request(url + "/v1/audio/speech", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_WAIT) as response:
            return response.status, len(response.read())
    except urllib.error.HTTPError as error:
        return error.code, len(error.read())


def open_slow(port: int, index: int) -> socket.socket:
    """Half send a request head they never finish; half a complete head and a body 10 bytes short."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if index % 2:
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")
    else:
        body = json.dumps({"model": "x", "input": "y" * 30}).encode()
        head = (
            f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body[:-10])
    return sock


@pytest.mark.slow  # 200 connections held to their deadlines
def test_200_slow_connections_are_closed_in_time_while_normal_requests_are_served():
    """Steps: open 200 slow connections against a 256-descriptor daemon, trickling a byte a second to the
    head-senders; ordinary GETs and speech requests succeed meanwhile, all along; once the daemon has answered a
    request it read after every slow connection's deadline was due, each is closed; the daemon's descriptors
    return to where they were."""
    with slow_daemon() as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        port = int(url.rsplit(":", 1)[1])
        assert "descriptors: limit 256" in daemon.log()
        baseline = psutil.Process(daemon.pid).num_fds()
        slow = [open_slow(port, i) for i in range(SLOW)]
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(1.0):
                for i, sock in enumerate(slow):
                    if i % 2:
                        try:
                            sock.send(b"s")
                        except OSError:
                            pass

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        try:
            served = [get(url + "/health")[0] for _ in range(20)]
            assert served == [200] * 20
            # The daemon accepts in order from one queue and reads what each slow client already sent before it
            # answers a GET that connected after them: by now every slow connection's deadline is armed, and due
            # by `due` on the daemon's clock (asyncio's is time.monotonic, this one).
            due = time.monotonic() + max(HEADER_TIMEOUT, BODY_TIMEOUT)
            spoken: list[tuple[int, int]] = []
            while True:
                sent = time.monotonic()
                spoken.append(speech(url))  # an ordinary request while slow connections are held
                if sent > due:
                    break
                time.sleep(0.2)
            # That request was read after `due`: the event loop ran every due deadline (and closed its
            # connection) before it answered, however late the daemon was scheduled.
            still_open = [i for i, sock in enumerate(slow) if not closed_by_server(sock)]
            assert not still_open, (
                f"{len(still_open)} slow connections still open after their deadline "
                f"(odd: request head, even: request body): {still_open[:10]}"
            )
        finally:
            stop.set()
            trickler.join(5)
            for sock in slow:
                sock.close()
        assert get(url + "/health")[0] == 200
        assert spoken and all(status == 200 and size > 0 for status, size in spoken), spoken
        print(f"\n{len(spoken)} speech requests answered while {SLOW} slow connections were open or closing")
        poll_until(
            lambda: psutil.Process(daemon.pid).num_fds() <= baseline + 4,
            timeout=30,
            message=f"the daemon's descriptors back near {baseline}",
        )
        assert "its request head took over" in daemon.log() or "still sending its request" in daemon.log()


def test_a_host_header_of_another_name_is_refused_on_loopback():
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends `Host: evil.example`."""
    with slow_daemon() as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        port = url.rsplit(":", 1)[1]
        status, body = get(url + "/v1/models", host=f"evil.example:{port}")
        assert status == 400 and b"host" in body.lower()
        assert get(url + "/v1/models", host=f"localhost:{port}")[0] == 200
        assert get(url + "/v1/models")[0] == 200  # 127.0.0.1:PORT


def stream_session(url: str, seconds: float, opened: threading.Semaphore) -> dict:
    """A speech WebSocket that sends a sentence every half second for `seconds`, then `end`; its last message."""
    from websockets.sync.client import connect

    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    with connect(ws_url, open_timeout=10, proxy=None) as ws:
        opened.release()
        ws.send(json.dumps({"type": "start", "model": "slow-clients", "response_format": "pcm"}))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ws.send(json.dumps({"type": "text", "text": "one more sentence. "}))
            time.sleep(0.5)  # the pace of an LLM writing: the session must outlive the read deadlines
        ws.send(json.dumps({"type": "end"}))
        return json.loads([m for m in ws if isinstance(m, str)][-1])


@pytest.mark.slow  # waits out the body deadline
def test_a_websocket_session_outlives_the_body_deadline_and_no_newcomer_evicts_it():
    """The HTTP connection a WebSocket was upgraded from kept its request-body deadline (and stayed evictable at
    the cap): every session was cut --http-body-timeout seconds after it opened, without a close frame."""
    with slow_daemon("--http-max-connections", "2") as daemon:
        daemon.wait_serving()
        url = daemon.http_url()
        port = int(url.rsplit(":", 1)[1])
        results: list[object] = []
        opened = threading.Semaphore(0)

        def run() -> None:
            try:
                results.append(stream_session(url, 2 * BODY_TIMEOUT, opened))
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                results.append(error)

        sessions = [threading.Thread(target=run) for _ in range(2)]
        for thread in sessions:
            thread.start()
        for _ in sessions:
            assert opened.acquire(timeout=30), results
        # At the cap, with both sessions busy: newcomers take the places kept for health probes (or are closed past
        # them), the sessions are not touched.
        newcomers = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        for thread in sessions:
            thread.join(2 * BODY_TIMEOUT + ANSWER_WAIT)  # a session cut short ends at once; this only bounds a hang
        for sock in newcomers:
            sock.close()
        assert [r.get("type") if isinstance(r, dict) else r for r in results] == ["done", "done"]
        poll_until(lambda: get(url + "/health")[0] == 200, timeout=10, message="the closed sessions' places freed")
