"""--standby-worker: a built standby takes over a crashed group's worker, and is replaced and stopped like one."""

from __future__ import annotations

import os
import re
import signal

import grpc

from tests.integration.daemon_helpers import DaemonProcess, alive, make_plan, poll_until, synthesize
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc

STANDBY = re.compile(r"worker 'pipeline': standby worker pid (\d+) started")


def cpu_pipeline():
    return make_plan(
        "standby",
        [("talker", "pipeline", None, None), ("speaker", "pipeline", None, None)],
        factories={
            "talker": "tests.integration.daemon_stages:make_talker",
            "speaker": "tests.integration.daemon_stages:make_speaker",
        },
    )


def standbys(daemon: DaemonProcess, count: int) -> list[int]:
    """The pids of the first `count` standby workers, once each has built its stages and waits."""

    def ready():
        log = daemon.log()
        pids = [int(pid) for pid in STANDBY.findall(log)]
        waiting = log.count("standby: stages talker, speaker built; waiting to take over")
        return pids[:count] if len(pids) >= count and waiting >= count else None

    return poll_until(ready, timeout=60, message=f"{count} standby workers built")


def test_a_crashed_worker_is_replaced_by_its_standby_which_serves_and_is_itself_replaced():
    """
    1. the group's worker becomes READY, then its standby starts, builds its stages and waits;
    2. SIGKILL the worker: after the backoff, the standby (same pid) is the group's worker, READY
       with the standby's phases, and speech goes on through it;
    3. a new standby starts for the next crash; an operator's restart takes it in turn;
    4. at shutdown the worker and the last standby are stopped.
    """
    with DaemonProcess(cpu_pipeline(), "--standby-worker", "pipeline") as daemon:
        daemon.wait_serving()
        (standby,) = standbys(daemon, 1)
        worker = daemon.topology()["groups"][0]["pid"]
        assert standby != worker and alive(standby)
        with grpc.insecure_channel(daemon.admin_address) as channel:
            events = admin_pb2_grpc.AdminStub(channel).WatchEvents(admin_pb2.WatchEventsRequest(), timeout=60)
            events.initial_metadata()  # subscribed before the kill
            os.kill(worker, signal.SIGKILL)
            ready = next(e for e in events if e.new_state == "READY")
            events.cancel()
        assert ready.pid == standby
        assert re.fullmatch(
            r"started in [\d.]+s: standby activation [\d.]+s, serve [\d.]+s, handshake [\d.]+s", ready.reason
        ), ready.reason
        assert daemon.topology()["groups"][0]["pid"] == standby
        pcm, rate = synthesize(daemon.listen, "after the takeover", options={})
        assert rate == 16000 and len(pcm) > 0
        _, second = standbys(daemon, 2)
        assert second not in (worker, standby) and alive(second)
        # An operator's restart takes the standby too.
        restarted = daemon.cli("restart", "pipeline")
        assert restarted.returncode == 0, restarted.stderr
        assert daemon.topology()["groups"][0]["pid"] == second and not alive(standby)
        _, _, third = standbys(daemon, 3)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        poll_until(
            lambda: not any(alive(pid) for pid in (standby, second, third)), timeout=30, message="every worker stopped"
        )
        assert "still running; sending SIGKILL" not in daemon.log()
