"""A soak of the serving runtime: a few hundred requests, ending every way they do over weeks, leave nothing behind.

One daemon (an entry streaming across processes to a terminal stage, tests/integration/soak_stages.py) serves
gRPC and HTTP with tight admission limits, so some requests wait and some are refused. Client threads drive
every way a request ends: with its audio; refused as invalid; failed by its stage before or after its first
audio; through shared memory; a gRPC client cancelling before or after its first audio, or out of its
deadline; an HTTP client hanging up before its first audio, mid-stream (audio or SSE), after it stopped
reading, or right after sending a batch; a WebSocket session cancelled or dropped mid-sentence. Then what an
operator can see is back at rest (no request in the gateway, in admission, in the request metrics or in a
stage), no request hung, and after a second round the daemon's and the workers' descriptors and threads are no
more than after the first, and the shared-memory area holds no more than the senders' pools keep. The slow tests
do the same while workers are restarted, with and without a pause, and killed mid-request; the last while a
seeded random sequence of restarts, scales and kills runs.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
from tests.integration.daemon_helpers import DaemonProcess, alive, make_plan, poll_until

ROUND = 120
"""Requests per round; the test runs two."""
CLIENTS = 8
HUNG_S = 50.0
"""No request of the mix takes more than seconds, queueing included; one that took this long was stuck (its
client gives up after 60 s)."""
SLACK_FDS = 8
"""Descriptors a process may hold beyond its count after the first round: connections still closing."""
SLACK_THREADS = 2
MAX_SHARED_FILES = 64
"""Files the senders' pools may keep in the area at rest (8 free each, more for a recent peak); a pooled file
per large handoff kept for good would pass it within a round (each `big` request hands over 8)."""

SOAK = {"front": "tests.integration.soak_stages:make_front", "voice": "tests.integration.soak_stages:make_voice"}
SLOW_FIRST_AUDIO = {"chunks": "4", "delay": "1"}
"""A request whose first audio comes after a second: a client can leave before it."""
LONG_STREAM = {"chunks": "200", "interval": "0.01"}
"""A request streaming for about two seconds: a client can leave in the middle."""


@pytest.fixture(scope="module")
def soak():
    shm = tempfile.mkdtemp(prefix="svshm")
    plan = make_plan("soak", [("front", "front", None, None), ("voice", "voice", None, None)], factories=SOAK)
    limits = ("--max-concurrent-requests", "4", "--max-queued-requests", "4", "--queue-timeout", "5")
    with DaemonProcess(plan, "--http", "127.0.0.1:0", *limits, env={"STAGEVISOR_SHM_DIR": shm}) as daemon:
        daemon.wait_serving()
        daemon.url = daemon.http_url()
        daemon.shm = Path(shm)
        yield daemon
    shutil.rmtree(shm, ignore_errors=True)  # empty: the daemon removed its area as it stopped


# ---- one request of each kind ----------------------------------------------------------


def grpc_request(address: str, options: dict[str, str], *, timeout: float = 60.0, leave: str = "") -> str:
    """One Synthesize call; `leave` = `early` cancels it after 0.1 s, `mid` after its second chunk."""
    with grpc.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        call = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="hello", options=options), timeout=timeout)
        try:
            if leave == "early":
                time.sleep(0.1)
                call.cancel()
                return "left"
            for received, _ in enumerate(call, 1):
                if leave == "mid" and received == 2:
                    call.cancel()
                    return "left"
            return "OK"
        except grpc.RpcError as error:
            return error.code().name


def http_send(url: str, path: str, body: dict[str, Any], receive_buffer: int = 0) -> socket.socket:
    """A POST of `body` on a raw connection, so the test decides when the client hangs up."""
    parts = urlsplit(url)
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(60)
    sock.connect((parts.hostname, parts.port))
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    return sock


def http_speech(url: str, fields: dict[str, str], *, leave: str = "") -> str:
    """POST /v1/audio/speech; `leave` = `early` hangs up after 0.1 s, `mid` once 2000 bytes came, `stalled` reads
    nothing (a small receive buffer: the daemon's writes stall), then hangs up."""
    body = {"model": "soak", "input": "hello", "response_format": "pcm", **fields}
    sock = http_send(url, "/v1/audio/speech", body, receive_buffer=4096 if leave == "stalled" else 0)
    with sock:
        if leave in ("early", "stalled"):
            time.sleep(0.1 if leave == "early" else 1.0)
            return "left"
        received = b""
        while piece := sock.recv(65536):
            received += piece
            if leave == "mid" and len(received) > 2000:
                return "left"
        return received.split(b" ", 2)[1].decode() if received else "closed"


def http_batch_left(url: str) -> str:
    """A batch of three slow requests whose client hangs up right after sending it."""
    items = [{"model": "soak", "input": "hello", "response_format": "pcm", **SLOW_FIRST_AUDIO}] * 3
    with http_send(url, "/v1/audio/speech/batch", {"requests": items}):
        time.sleep(0.1)
    return "left"


def websocket_session(url: str, leave: str) -> str:
    """A WebSocket session that hears its first audio, then `cancel`s or goes away mid-sentence."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with connect("ws" + url[len("http") :] + "/v1/audio/speech/stream", open_timeout=60) as session:
        session.send(json.dumps({"type": "start", "model": "soak", **LONG_STREAM}))
        session.send(json.dumps({"type": "text", "text": "Hello there. And more."}))
        try:
            while isinstance(message := session.recv(timeout=60), str):
                if json.loads(message)["type"] == "error":
                    return "refused"
            if leave == "cancel":
                session.send(json.dumps({"type": "cancel"}))
                while True:
                    session.recv(timeout=60)
        except ConnectionClosed:
            pass
    return "left"


def kinds(daemon: DaemonProcess) -> dict[str, Callable[[], str]]:
    """Every way a request ends, by name."""
    address, url = daemon.listen, daemon.url
    return {
        "grpc ok": lambda: grpc_request(address, {"chunks": "4"}),
        "grpc invalid": lambda: grpc_request(address, {"invalid": "1"}),
        "grpc fails before audio": lambda: grpc_request(address, {"fail": "before"}),
        "grpc fails after audio": lambda: grpc_request(address, {"fail": "after"}),
        "grpc shared memory": lambda: grpc_request(address, {"big": "1", "chunks": "8"}),
        "grpc cancelled before audio": lambda: grpc_request(address, SLOW_FIRST_AUDIO, leave="early"),
        "grpc cancelled mid-stream": lambda: grpc_request(address, LONG_STREAM, leave="mid"),
        "grpc deadline": lambda: grpc_request(address, LONG_STREAM, timeout=0.3),
        "http ok": lambda: http_speech(url, {"chunks": "4"}),
        "http fails after audio": lambda: http_speech(url, {"fail": "after"}),
        "http gone before audio": lambda: http_speech(url, SLOW_FIRST_AUDIO, leave="early"),
        "http gone mid-stream": lambda: http_speech(url, LONG_STREAM, leave="mid"),
        "sse gone mid-stream": lambda: http_speech(url, {**LONG_STREAM, "stream_format": "sse"}, leave="mid"),
        "http gone after it stopped reading": lambda: http_speech(
            url, {"chunks": "40", "samples": "48000"}, leave="stalled"
        ),
        "http batch gone": lambda: http_batch_left(url),
        "websocket cancelled": lambda: websocket_session(url, "cancel"),
        "websocket gone": lambda: websocket_session(url, "gone"),
    }


REFUSED = {"RESOURCE_EXHAUSTED", "429", "refused"}


class Round:
    """What a round of requests came to: (kind, outcome) -> count, and the slowest request of each kind."""

    def __init__(self) -> None:
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.slowest: dict[str, float] = {}

    def add(self, other: "Round") -> None:
        self.outcomes += other.outcomes
        for kind, seconds in other.slowest.items():
            self.slowest[kind] = max(seconds, self.slowest.get(kind, 0.0))

    def check(self) -> None:
        """Every kind ran at least once (not every request of it refused), and none hung."""
        for kind in self.slowest:
            ran = [outcome for (name, outcome) in self.outcomes if name == kind and outcome not in REFUSED]
            assert ran, f"every request of kind {kind!r} was refused: {self.outcomes}"
        hung = {kind: seconds for kind, seconds in self.slowest.items() if seconds > HUNG_S}
        assert not hung, f"requests that took over {HUNG_S:g} s to end, by kind: {hung}; outcomes {self.outcomes}"


def run_round(daemon: DaemonProcess, seed: int) -> Round:
    """ROUND requests of every kind, from CLIENTS threads at once."""
    ways = kinds(daemon)
    names = list(ways) * (ROUND // len(ways)) + random.Random(seed).sample(list(ways), ROUND % len(ways))
    random.Random(seed).shuffle(names)

    def one(name: str) -> tuple[str, str, float]:
        began = time.monotonic()
        try:
            outcome = ways[name]()
        except OSError as error:  # a client's own timeout (socket.timeout is an OSError): the request hung
            outcome = type(error).__name__
        return name, outcome, time.monotonic() - began

    result = Round()
    with ThreadPoolExecutor(CLIENTS) as pool:
        for name, outcome, seconds in pool.map(one, names):
            result.outcomes[(name, outcome)] += 1
            result.slowest[name] = max(seconds, result.slowest.get(name, 0.0))
    return result


# ---- what the daemon shows ------------------------------------------------------------------


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def held(daemon: DaemonProcess) -> dict[str, float]:
    """Requests held anywhere the daemon shows them: all 0 at rest."""
    admission = json.loads(urllib.request.urlopen(daemon.url + "/v1/topology", timeout=30).read())["admission"]
    samples = scrape(daemon.url)
    status = daemon.admin_status()
    counts = {
        "gateway": status["in_flight"] if status is not None else -1,  # -1: the admin API did not answer
        "admission running": admission["running"],
        "admission queued": admission["queued"],
        "metered in flight": samples[("stagevisor_requests_in_flight", frozenset({("model", "soak")}))],
    }
    for (name, labels), value in samples.items():
        if name == "stagevisor_stage_in_flight":
            counts[f"stage {dict(labels)['stage']} calls"] = value
    return counts


def at_rest(daemon: DaemonProcess) -> None:
    """Wait (bounded) until no request is held anywhere; the failure names what still held one."""
    seen: list[dict[str, float]] = []

    def resting() -> bool:
        seen.append(held(daemon))
        return not any(seen[-1].values())

    try:
        poll_until(resting, timeout=60, interval=0.2, message="every request to end")
    except AssertionError:
        raise AssertionError(f"requests still held 60 s after the round: {seen[-1]}") from None


def process_counts(daemon: DaemonProcess) -> dict[str, int]:
    """Descriptors and threads of the daemon (from /proc) and of each worker (as its status reports them)."""
    status_text = Path(f"/proc/{daemon.pid}/status").read_text()
    counts = {
        "daemon fds": len(os.listdir(f"/proc/{daemon.pid}/fd")),
        "daemon threads": int(re.search(r"Threads:\s+(\d+)", status_text).group(1)),
    }
    status = poll_until(daemon.admin_status, timeout=60, message="the daemon's status")
    for group in status["groups"]:
        resources = group.get("resources") or {}
        counts[f"{group['name']} fds"] = resources.get("open_fds", 0)
        counts[f"{group['name']} threads"] = resources.get("threads", 0)
    return counts


def shared_files(daemon: DaemonProcess) -> list[str]:
    """The files in the daemon's shared-memory area, each named `<writer pid>-<random>`."""
    (area,) = daemon.shm.glob("stagevisor-*")
    return [entry.name for entry in area.iterdir()]


def assert_nothing_left_since(daemon: DaemonProcess, before: dict[str, int]) -> None:
    """At most `before`'s descriptors and threads (plus slack: connections still closing), and in the shared
    memory area only files of live senders, no more than their pools keep."""

    def within() -> dict[str, int] | None:
        now = process_counts(daemon)
        slack = {name: SLACK_THREADS if name.endswith("threads") else SLACK_FDS for name in now}
        return now if all(now[name] <= before.get(name, 0) + slack[name] for name in now) else None

    poll_until(within, timeout=30, message=f"descriptors and threads at most {before} plus slack")
    files = shared_files(daemon)
    assert len(files) <= MAX_SHARED_FILES, files
    assert all(alive(int(name.split("-")[0])) for name in files), files


def settled(daemon: DaemonProcess) -> dict[str, int]:
    """The descriptors and threads at rest, once the workers' (measured every second) are measured at rest."""
    at_rest(daemon)
    time.sleep(2)
    return process_counts(daemon)


@pytest.mark.slow  # a few hundred requests
def test_a_few_hundred_requests_ending_every_way_leave_no_request_descriptor_or_thread_behind(soak):
    """1. a round of ROUND mixed requests; 2. every request has ended everywhere the daemon shows them;
    3. a second round; 4. at rest again, with no more descriptors and threads than after the first round,
    and no shared file but those of live senders' pools. No request hung in either round."""
    rounds = run_round(soak, seed=1)
    before = settled(soak)
    rounds.add(run_round(soak, seed=2))
    at_rest(soak)
    rounds.check()
    assert rounds.outcomes[("grpc ok", "OK")] and rounds.outcomes[("http ok", "200")], rounds.outcomes
    assert_nothing_left_since(soak, before)


def under_load(daemon: DaemonProcess, seed: int, operations: Callable[[], None]) -> Round:
    """Run `operations` while rounds of mixed requests (seeds from `seed` on) run back to back, so each one
    happens under load; what those rounds came to."""
    stop = threading.Event()

    def load() -> Round:
        under_way, next_seed = Round(), seed
        while not stop.is_set():
            under_way.add(run_round(daemon, next_seed))
            next_seed += 1
        return under_way

    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(load)
        try:
            operations()
        finally:
            stop.set()
        return loading.result(timeout=600)


def ready_workers(daemon: DaemonProcess) -> dict[str, int]:
    """Group -> pid of its READY worker, once the daemon is SERVING with every group READY (else empty)."""
    status = daemon.admin_status()
    if status is None or status["state"] != "SERVING":
        return {}
    ready = {group["name"]: group["pid"] for group in status["groups"] if group["state"] == "READY"}
    return ready if len(ready) == len(status["groups"]) else {}


@pytest.mark.slow
@pytest.mark.soak
def test_workers_restarted_or_crashing_mid_request_leave_no_request_descriptor_or_file_behind(soak):
    """1. a round of mixed requests, at rest: the counts to compare with; 2. rounds under way while each group is
    restarted without a pause (its old worker drains beside the new one), the terminal group's worker is killed
    mid-request by its stage (twice, the second time while it is routed as a replicated group after the restart
    without a pause) and restarted with --force; 3. at rest again: no request hung, none is held, no more
    descriptors or threads than before, and no shared file of a worker that is gone."""
    rounds = run_round(soak, seed=3)
    before = settled(soak)
    pids = poll_until(lambda: ready_workers(soak), timeout=120, message="every group READY")

    def back(group: str) -> None:
        """Wait until `group` is READY again in a new worker."""
        old = pids[group]
        pids.update(
            poll_until(
                lambda: (lambda ready: ready if ready.get(group, old) != old else None)(ready_workers(soak)),
                timeout=120,
                message=f"group {group!r} READY in a new worker",
            )
        )

    def crash_voice() -> None:
        outcome = poll_until(  # retried while admission refuses it
            lambda: (lambda code: code if code != "RESOURCE_EXHAUSTED" else None)(
                grpc_request(soak.listen, {"fail": "crash"})
            ),
            timeout=120,
            message="a request that kills its worker admitted",
        )
        assert outcome == "UNAVAILABLE"
        back("voice")

    def restart(*args: str) -> None:
        result = soak.cli("restart", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        back(args[0])

    def operations() -> None:
        crash_voice()
        restart("front")
        restart("voice")
        crash_voice()
        restart("voice", "--force")

    rounds.add(under_load(soak, 4, operations))
    at_rest(soak)
    rounds.check()
    assert_nothing_left_since(soak, before)


OPERATIONS = 30
"""Random topology operations in the chaos soak, each once the one before has settled."""


@pytest.mark.slow
@pytest.mark.soak
def test_random_restarts_scales_and_kills_under_load_hang_no_request_and_leave_nothing_behind(soak):
    """Rounds of mixed requests run while a seeded random sequence of OPERATIONS changes the workers under
    them: restarts with and without --force, scales between one and two replicas, SIGKILL of a worker, and a
    request that makes its worker exit; after each, every group is READY again before the next. Then both
    groups back to one worker: no request hung (a worker stopped or lost while a request it held, or was
    being sent, was routed as a replicated group's once waited for its client's deadline), none is held, and
    no more descriptors, threads or shared files than before."""
    rounds = run_round(soak, seed=5)
    before = settled(soak)
    rng = random.Random(20261203)
    replicas = {"front": 1, "voice": 1}

    def all_ready() -> bool:
        status = soak.admin_status()
        return bool(
            status is not None
            and status["state"] == "SERVING"
            and all(group["state"] == "READY" for group in status["groups"])
        )

    def cli(*args: str) -> None:
        result = soak.cli(*args)
        assert result.returncode == 0, (args, result.stdout + result.stderr)

    def kill(group: str) -> None:
        status = poll_until(soak.admin_status, timeout=60, message="the daemon's status")
        pids = [g["pid"] for g in status["groups"] if g["name"].split("/")[0] == group and g.get("pid")]
        try:
            os.kill(rng.choice(pids), signal.SIGKILL)
        except ProcessLookupError:  # ended meanwhile (a scale-down, a restart's old worker)
            return
        poll_until(lambda: not all_ready(), timeout=10, interval=0.02, message="the kill noticed")

    done: list[str] = []

    def operations() -> None:
        for _ in range(OPERATIONS):
            group, operation = (
                rng.choice(["front", "voice"]),
                rng.choice(["restart", "force", "scale", "kill", "crash"]),
            )
            done.append(f"{operation} {group}")
            if operation == "restart":
                cli("restart", group)
            elif operation == "force":
                cli("restart", group, "--force")
            elif operation == "scale":
                replicas[group] = 3 - replicas[group]
                cli("scale", f"{group}={replicas[group]}")
            elif operation == "kill":
                kill(group)
            else:  # refused while admission is full: then it is one request fewer
                grpc_request(soak.listen, {"fail": "crash"})
            poll_until(all_ready, timeout=120, message=f"every group READY after {done}")
        for group in ("front", "voice"):
            if replicas[group] == 2:
                cli("scale", f"{group}=1")

    rounds.add(under_load(soak, 6, operations))
    at_rest(soak)
    rounds.check()
    assert_nothing_left_since(soak, before)
