"""Wedged workers: a worker whose event loop stops answering its heartbeat is replaced through the crash path.

A worker blocked by a synchronous call in a stage, or stopped with SIGSTOP,
is alive with its sockets open: without a heartbeat it would stay READY and
its requests would run to the client's deadline.
"""

from __future__ import annotations

import pytest
import os
import signal
import threading
from pathlib import Path

import grpc

from stagevisor.supervisor.placement.planner import rescale
from tests.integration.daemon_helpers import (
    DaemonProcess,
    alive,
    children,
    make_plan,
    poll_until,
    synthesize,
    worker_pids,
)

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

TALKER = "tests.integration.daemon_stages:make_talker"
SPEAKER = "tests.integration.daemon_stages:make_speaker"
DEADLINE = 120.0
"""Far beyond the heartbeat timeout: a request that reaches it has hung."""


def talk_then_speak():
    return make_plan(
        "liveness",
        [("talker", "front", None, None), ("speaker", "back", None, None)],
        factories={"talker": TALKER, "speaker": SPEAKER},
    )


def group(daemon: DaemonProcess, name: str) -> dict:
    return next(g for g in daemon.topology()["groups"] if g["name"] == name)


def call(address: str, text: str, deadline: float = DEADLINE) -> grpc.StatusCode:
    """One Synthesize call read to its end; its final status code."""
    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        try:
            for _ in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=text), timeout=deadline):
                pass
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def back_again(daemon: DaemonProcess, old_pid: int) -> dict:
    def ready():
        g = next(g for g in daemon.admin_topology()["groups"] if g["name"] == "back")
        return g if g["state"] == "READY" and g["pid"] not in (0, old_pid) else None

    return poll_until(ready, timeout=60, message="group 'back' READY with a new worker")


def test_a_stage_that_blocks_its_event_loop_is_replaced_and_its_request_fails_unavailable():
    """
    1. the terminal stage makes a synchronous call that never returns: its worker is alive but deaf;
    2. the request ends with UNAVAILABLE naming the group, not at its deadline; the log names the missed heartbeat;
    3. the group comes back with a new worker that serves.
    """
    with DaemonProcess(talk_then_speak(), "--heartbeat-timeout", "2") as daemon:
        daemon.wait_serving()
        wedged = group(daemon, "back")["pid"]
        from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

        with grpc.insecure_channel(daemon.listen) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            stream = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="hello block"), timeout=DEADLINE)
            try:
                for _ in stream:
                    pass
                raise AssertionError("the request completed although its stage never returned")
            except grpc.RpcError as error:
                failure = error
        assert failure.code() == grpc.StatusCode.UNAVAILABLE, failure.details()
        # The daemon fails the wedged group's requests before it kills the worker, saying why.
        assert "'back'" in failure.details() and "stopped answering its heartbeat" in failure.details()
        poll_until(lambda: not alive(wedged), timeout=30, message="wedged worker gone")
        again = back_again(daemon, wedged)
        assert again["restarts"] == 1
        pcm, rate = synthesize(daemon.listen, "still speaking", options={})
        assert rate == 16000 and len(pcm) == 2 * 2 * 160
        assert "did not answer its heartbeat for 2s" in daemon.log()


def test_a_sigstopped_worker_under_load_is_replaced_and_no_request_hangs():
    """
    1. eight clients keep requests in flight through both workers;
    2. the terminal worker is SIGSTOPped: it holds its connections open and reads nothing;
    3. every request ends, with audio or UNAVAILABLE, none at its deadline; the group comes back and serves.
    """
    with DaemonProcess(talk_then_speak(), "--heartbeat-timeout", "2") as daemon:
        daemon.wait_serving()
        stopped = group(daemon, "back")["pid"]
        text = " ".join(["word"] * 400)  # about 2 s of streaming per request
        codes: list[grpc.StatusCode] = []
        started = threading.Barrier(9, timeout=30)

        def client() -> None:
            started.wait()
            codes.append(call(daemon.listen, text))

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        started.wait()
        poll_until(
            lambda: (daemon.admin_status() or {}).get("in_flight", 0) >= 8, timeout=30, message="8 requests in flight"
        )
        os.kill(stopped, signal.SIGSTOP)
        for thread in threads:
            thread.join(DEADLINE + 30)
        assert not any(thread.is_alive() for thread in threads), "a client thread never returned"
        print(f"\nrequests under SIGSTOP: {len(codes)}, status codes: {sorted(c.name for c in codes)}")
        assert len(codes) == 8
        assert grpc.StatusCode.DEADLINE_EXCEEDED not in codes
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
        assert grpc.StatusCode.UNAVAILABLE in codes
        poll_until(lambda: not alive(stopped), timeout=30, message="stopped worker gone")
        back_again(daemon, stopped)
        assert call(daemon.listen, "after the restart") == grpc.StatusCode.OK
        # the reason says the process was stopped (its clients were told its event loop was blocked)
        assert (
            f"worker pid {stopped} of group 'back' did not answer its heartbeat for 2s: the process is stopped (SIG"
            in (daemon.log())
        )


def test_a_stopped_replica_takes_no_new_requests_once_silent_and_rejoins_when_it_answers():
    """
    1. `back` runs two replicas (heartbeat timeout 10 s: silent after three missed beats, 3 s);
    2. one replica is SIGSTOPped; status soon lists it as taking no requests;
    3. requests made meanwhile each succeed within 5 s: none goes to the stopped replica (before, about
       half did, and waited for the heartbeat timeout to kill it);
    4. SIGCONT before the timeout: it answers again, takes requests again, and kept its pid (never killed).
    """
    with DaemonProcess(rescale(talk_then_speak(), "back", 2), "--heartbeat-timeout", "10") as daemon:
        daemon.wait_serving()
        stopped = group(daemon, "back")["workers"][1]["pid"]

        def taking_none() -> list[str]:
            return (daemon.admin_status() or {}).get("missing_replicas", [])

        os.kill(stopped, signal.SIGSTOP)
        try:
            poll_until(lambda: taking_none() == ["back/1"], timeout=7, message="back/1 out of rotation")
            codes = [call(daemon.listen, f"request {i} while back/1 is stopped", deadline=5.0) for i in range(4)]
        finally:
            os.kill(stopped, signal.SIGCONT)
        assert codes == [grpc.StatusCode.OK] * 4
        poll_until(lambda: taking_none() == [], timeout=30, message="back/1 back in rotation")
        assert stopped in [w["pid"] for w in group(daemon, "back")["workers"]]
        log = daemon.log()
        assert f"worker pid {stopped} of group 'back/1' sent no heartbeat for" in log
        assert (
            "it takes no new requests (another replica does) until it answers" in log
            and "answers its heartbeat again" in log
        )


def fork_servers(daemon_pid: int) -> list[int]:
    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    return [pid for pid in children(daemon_pid) if "multiprocessing.forkserver" in cmdline(pid)]


def test_a_killed_fork_server_takes_its_workers_down_and_every_group_comes_back():
    """
    1. the daemon's fork server is SIGKILLed: its workers die with it (PR_SET_PDEATHSIG);
    2. the daemon restarts every group, which starts a new fork server;
    3. requests are served again.
    """
    with DaemonProcess(talk_then_speak(), "--heartbeat-timeout", "2") as daemon:
        daemon.wait_serving()
        [server] = fork_servers(daemon.pid)
        workers = worker_pids(daemon.pid)
        assert len(workers) == 2 and all(_parent(pid) == server for pid in workers)
        os.kill(server, signal.SIGKILL)
        poll_until(lambda: not any(alive(pid) for pid in [server, *workers]), timeout=30, message="workers gone")

        def all_back():
            groups = daemon.admin_topology()["groups"]
            ready = all(g["state"] == "READY" and g["pid"] not in (0, *workers) for g in groups)
            return groups if ready else None

        poll_until(all_back, timeout=90, message="every group READY with a new worker")
        assert len(fork_servers(daemon.pid)) == 1 and fork_servers(daemon.pid) != [server]
        assert call(daemon.listen, "served again") == grpc.StatusCode.OK


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
