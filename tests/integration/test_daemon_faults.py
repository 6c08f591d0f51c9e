"""A real daemon under faults: a shutdown step that fails, a worker that is down, a factory that builds nothing.

Issue 12 items 2 and 10.
"""

from __future__ import annotations

import pytest
import os
import shutil
import signal
from pathlib import Path

import grpc

from stagevisor.supervisor.dataplane import shm
from tests.integration.daemon_helpers import (
    DaemonProcess,
    alive,
    colocated_pipeline,
    comm,
    make_plan,
    poll_until,
    worker_pids,
)

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

NONE_FACTORY = "tests.integration.daemon_stages:make_nothing"


def test_shutdown_completes_when_a_directory_is_planted_where_a_shared_buffer_is_expected():
    """Steps: a daemon serves; a directory appears where one of its shared buffers could be (its
    private area only lets its own user in, so this stands for any failure of a shutdown step);
    SIGTERM. The daemon still stops every worker, removes its sockets and exits."""
    with DaemonProcess(colocated_pipeline()) as daemon:
        daemon.wait_serving()
        daemon.track()  # cleanup kills every descendant, even if the test fails
        workers = worker_pids(daemon.pid)
        run_dir = daemon.tmp / "run" / f"d{daemon.pid}"
        # The daemon's private shared-memory area; inside it, a directory named like a buffer.
        [area] = shm.shm_root().glob(f"stagevisor-{os.getuid()}-{daemon.pid}-*")
        planted = area / f"{daemon.pid}-{'0' * 16}"
        planted.mkdir()
        try:
            os.kill(daemon.pid, signal.SIGTERM)
            assert daemon.wait_exit(timeout=60) == 0, daemon.log()
        finally:
            shutil.rmtree(planted, ignore_errors=True)
        assert workers and not any(alive(pid) for pid in workers), [comm(pid) for pid in workers if alive(pid)]
        assert not run_dir.exists()
        assert not Path(daemon.admin_address[len("unix:") :]).exists()
        assert not Path(daemon.listen[len("unix:") :]).exists()


def test_fast_failed_requests_while_a_worker_is_down_log_a_bounded_number_of_lines():
    """Steps: the vocoder's worker is killed and not restarted (--max-restarts 0); 60 requests fail fast
    with UNAVAILABLE naming the FAILED group and the restart that brings it back (admission refuses them: no
    request id, no worker sees them); the daemon log does not grow a line per request."""
    plan = make_plan("two", [("engine", "engine", None, None), ("vocoder", "vocoder", None, None)])
    with DaemonProcess(plan, "--max-restarts", "0") as daemon:
        daemon.wait_serving()
        victim = next(g["pid"] for g in daemon.topology()["groups"] if g["name"] == "vocoder")
        os.kill(victim, signal.SIGKILL)
        poll_until(lambda: (daemon.admin_status() or {}).get("state") == "DEGRADED", timeout=30, message="DEGRADED")
        before = daemon.log().count("\n")
        errors = []
        with grpc.insecure_channel(daemon.listen) as channel:
            from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            for _ in range(60):
                try:
                    for _chunk in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="hello"), timeout=30):
                        pass
                except grpc.RpcError as error:
                    errors.append(error)
        assert len(errors) == 60
        assert {e.code() for e in errors} == {grpc.StatusCode.UNAVAILABLE}
        assert all(
            "process group 'vocoder' FAILED" in e.details() and "`stagevisor restart vocoder`" in e.details()
            for e in errors
        ), errors[0].details()
        added = daemon.log().count("\n") - before
        print(f"daemon log lines for 60 fast-failed requests: {added}")
        assert added < 20, daemon.log()


def test_a_factory_that_returns_none_fails_startup_naming_the_stage():
    plan = make_plan(
        "none",
        [("engine", "engine", None, None), ("vocoder", "vocoder", None, None)],
        factories={"vocoder": NONE_FACTORY},
    )
    with DaemonProcess(plan) as daemon:
        assert daemon.wait_exit(timeout=90) == 1
        log = daemon.log()
        assert "group 'vocoder' failed to start" in log
        assert "stage 'vocoder' failed to build" in log and "returned None" in log
