"""A frozen worker is visible: status, topology and readiness say so from the moment it counts as silent.

Before, a group whose only worker was stopped (SIGSTOP) or whose event loop was blocked stayed READY in
`stagevisor status`, and gRPC health and /ready said SERVING until the heartbeat timeout killed it: a load
balancer kept sending requests that waited for it.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.daemon_helpers import ServeProcess, poll_until


def ready(base: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"{base}/ready", timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_a_stopped_worker_of_the_default_voice_is_silent_in_status_and_not_ready_until_it_answers_again():
    """
    1. `serve` of the default voice, heartbeat timeout 20 s (silent after three missed beats: 3 s);
    2. one worker is SIGSTOPped: status (JSON and table) keeps it READY with `silent_s`, the daemon turns
       DEGRADED, /ready answers 503 naming it and gRPC health NOT_SERVING, while /health stays up;
    3. SIGCONT well before the timeout: it beats again, its `silent_s` is null, /ready 200 and health SERVING, and
       it kept its pid (never killed).
    """
    with ServeProcess("--http", "127.0.0.1:0", "--heartbeat-timeout", "20") as daemon:
        daemon.wait_serving()
        base = daemon.http_url()
        assert ready(base)[0] == 200 and health(daemon.listen) == health_pb2.HealthCheckResponse.SERVING
        target = next(g for g in daemon.admin_status()["groups"] if g["pid"])
        name, pid = target["name"], target["pid"]

        def silent() -> dict | None:
            status = daemon.admin_status() or {}
            worker = next((g for g in status.get("groups", ()) if g["name"] == name), None)
            return status if worker and worker["silent_s"] is not None and status["state"] == "DEGRADED" else None

        os.kill(pid, signal.SIGSTOP)
        try:
            status = poll_until(silent, timeout=12, interval=0.2, message=f"{name} silent in status")
            code, body = ready(base)
            grpc_health = health(daemon.listen)
            with urllib.request.urlopen(f"{base}/health", timeout=10) as response:
                live = response.status
            table = daemon.cli("status").stdout
        finally:
            os.kill(pid, signal.SIGCONT)
        worker = next(g for g in status["groups"] if g["name"] == name)
        assert worker["state"] == "READY" and worker["pid"] == pid and 0.0 <= worker["silent_s"] < 17.0
        assert code == 503 and body["ready"] is False and body["state"] == "DEGRADED"
        assert [w["name"] for w in body["workers_silent"]] == [name]
        assert grpc_health == health_pb2.HealthCheckResponse.NOT_SERVING
        assert live == 200  # liveness stays up: the daemon is alive, one worker is not answering
        [row] = [line for line in table.splitlines() if line.lstrip().startswith(f"{name} ")]
        assert " READY " in row and "  silent " in row
        assert f", 1 worker silent ({name}), " in table.splitlines()[1]  # beside `groups: 1/1 READY`

        def answering() -> dict | None:
            status = daemon.admin_status() or {}
            return status if status.get("state") == "SERVING" else None

        status = poll_until(answering, timeout=30, interval=0.2, message="daemon SERVING again")
        assert [g["silent_s"] for g in status["groups"]] == [None] * len(status["groups"])
        assert next(g for g in status["groups"] if g["name"] == name)["pid"] == pid
        assert ready(base)[0] == 200 and health(daemon.listen) == health_pb2.HealthCheckResponse.SERVING
        log = daemon.log()
        assert f"worker pid {pid} of group {name!r} sent no heartbeat for" in log
        assert "readiness is NOT_SERVING until it answers" in log and "answers its heartbeat again" in log
