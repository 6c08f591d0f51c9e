"""Restarts, worker crashes, signals and shutdown of a real daemon with real spawned workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.daemon_helpers import (
    BROKEN,
    ROOT,
    DaemonProcess,
    make_plan,
    alive,
    colocated_pipeline,
    higgs_isolated_audio_encoder,
    ming_isolated_audio_decode,
    poll_until,
    worker_pids,
)
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc, synthesis_pb2, synthesis_pb2_grpc

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow


def group(topology: dict, name: str) -> dict:
    return next(g for g in topology["groups"] if g["name"] == name)


def workers(topology: dict) -> list[tuple[str, int, int]]:
    return [(g["name"], g["pid"], g["restarts"]) for g in topology["groups"]]


def test_restart_group_replaces_that_workers_pid_only():
    with DaemonProcess(higgs_isolated_audio_encoder()) as daemon:
        daemon.wait_serving()
        before = daemon.topology()
        result = daemon.cli("restart", "audio_encoder")
        # GPU 0 holds 0.98 of the plan's fractions: no room for a second worker beside it, nothing changes.
        assert result.returncode == 2 and "error: restarting group 'audio_encoder'" in result.stderr
        assert workers(daemon.topology()) == workers(before)
        result = daemon.cli("restart", "audio_encoder", "--force")
        assert result.returncode == 0, result.stderr
        after = daemon.topology()
        old, new = group(before, "audio_encoder")["pid"], group(after, "audio_encoder")["pid"]
        assert new != old and not alive(old)
        assert group(after, "audio_encoder")["state"] == "READY"
        assert group(after, "audio_encoder")["restarts"] == 1
        others = [g["pid"] for g in before["groups"] if g["name"] != "audio_encoder"]
        assert others == [g["pid"] for g in after["groups"] if g["name"] != "audio_encoder"]
        assert sorted(worker_pids(daemon.pid)) == sorted(g["pid"] for g in after["groups"])


@pytest.fixture(scope="module")
def colocated():
    """One daemon for the tests that leave it as they found it (a refused restart, a refused second daemon)."""
    with DaemonProcess(colocated_pipeline()) as daemon:
        daemon.wait_serving()
        yield daemon


def test_restart_of_an_unknown_group_names_the_known_groups(colocated):
    daemon = colocated
    pid = group(daemon.admin_topology(), "pipeline")["pid"]
    result = daemon.cli("restart", "nope")
    assert result.returncode == 2  # a usage error, as `scale nope=2` is (it was 1, the status of a failed restart)
    assert "error: no process group 'nope'; known groups: pipeline" in result.stderr
    assert group(daemon.admin_topology(), "pipeline")["pid"] == pid


def test_an_admin_request_that_does_not_parse_is_invalid_argument(colocated):
    """It got grpc.aio's UNKNOWN "Unexpected <class 'DecodeError'>", and the daemon logged an ERROR traceback."""
    with grpc.insecure_channel(colocated.admin_address) as channel:
        status = channel.unary_unary(
            "/stagevisor.v1.Admin/GetStatus",
            request_serializer=lambda data: data,
            response_deserializer=admin_pb2.Status.FromString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            status(b"\xff\xff\xff", timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "proto/stagevisor/v1/admin.proto" in caught.value.details()
        assert status(admin_pb2.GetStatusRequest().SerializeToString(), timeout=30).state == "SERVING"
    assert "DecodeError" not in colocated.log()


def test_sigkilled_worker_is_noticed_and_its_group_comes_back_with_a_new_pid():
    with DaemonProcess(ming_isolated_audio_decode()) as daemon:
        daemon.wait_serving()
        victim = group(daemon.topology(), "audio_decode")["pid"]
        os.kill(victim, signal.SIGKILL)

        def replaced():
            status = daemon.admin_status()
            g = status and next(g for g in status["groups"] if g["name"] == "audio_decode")
            return g if g and g["state"] == "READY" and g["pid"] != victim else None

        back = poll_until(replaced, timeout=60, message="audio_decode READY with a new pid")
        assert back["restarts"] == 1
        status = daemon.status()
        assert "killed by SIGKILL" in status["root_cause"]["message"]
        assert len(worker_pids(daemon.pid)) == 2


def test_group_crashing_past_the_restart_limit_is_failed_and_health_not_serving():
    with DaemonProcess(colocated_pipeline(), "--max-restarts", "1") as daemon:
        daemon.wait_serving()
        first = group(daemon.topology(), "pipeline")["pid"]
        os.kill(first, signal.SIGKILL)
        second = poll_until(
            lambda: (lambda g: g["pid"] if g["state"] == "READY" and g["pid"] != first else 0)(
                group(daemon.admin_topology(), "pipeline")
            ),
            message="first restart",
        )
        os.kill(second, signal.SIGKILL)
        poll_until(lambda: group(daemon.admin_topology(), "pipeline")["state"] == "FAILED", message="FAILED")
        assert daemon.status()["state"] == "DEGRADED"
        with grpc.insecure_channel(daemon.listen) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            # A request is refused at once, naming the group and the restart, with no retry pushback: it went to
            # the dead worker's address and failed as "became unreachable; retry".
            with pytest.raises(grpc.RpcError) as caught:
                list(
                    synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(
                        synthesis_pb2.SynthesizeRequest(text="Hello."), timeout=30
                    )
                )
        error = caught.value
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "process group 'pipeline' FAILED" in error.details()
        assert "`stagevisor restart pipeline`" in error.details()
        assert "grpc-retry-pushback-ms" not in dict(error.trailing_metadata() or ())


def test_sigterm_to_the_daemon_leaves_no_process_behind():
    with DaemonProcess(higgs_isolated_audio_encoder()) as daemon:
        daemon.wait_serving()
        tree = daemon.track()
        assert len(tree) >= 4
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        poll_until(lambda: not any(alive(pid) for pid in tree), timeout=20, message="every descendant gone")
        assert not os.path.exists(daemon.admin_address[len("unix:") :])
        assert not os.path.exists(daemon.listen[len("unix:") :])
        assert list((daemon.tmp / "run").iterdir()) == []  # worker sockets removed with their directory


def test_sigkill_to_the_daemon_leaves_no_worker_alive():
    with DaemonProcess(higgs_isolated_audio_encoder()) as daemon:
        daemon.wait_serving()
        workers = worker_pids(daemon.pid)
        tree = daemon.track()  # the workers, their fork server, multiprocessing's resource tracker
        assert set(workers) < set(tree)
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait_exit(30)
        poll_until(lambda: not any(alive(pid) for pid in tree), timeout=10, message="workers and fork server gone")


def test_stop_command_returns_once_the_daemon_is_gone():
    with DaemonProcess(colocated_pipeline()) as daemon:
        daemon.wait_serving()
        tree = daemon.track()
        result = daemon.cli("stop", "--grace", "1")
        assert result.returncode == 0, result.stderr
        assert daemon.proc.poll() == 0
        poll_until(lambda: not any(alive(pid) for pid in tree), timeout=20, message="every descendant gone")


def test_stage_that_fails_to_build_fails_startup_with_its_exception_as_root_cause():
    plan = higgs_isolated_audio_encoder(factories={"vocoder": BROKEN})
    with DaemonProcess(plan) as daemon:
        assert daemon.wait_exit(90) == 1
        log = daemon.log()
        assert "error: STARTUP_FAILED: group 'vocoder' failed to start: stage 'vocoder' failed to build" in log
        assert "StageBuildBoom: weights not found" in log
        assert "Traceback" in log
        assert worker_pids(daemon.pid) == []


def test_refuses_to_start_when_a_live_daemon_answers_on_the_admin_socket(colocated):
    daemon = colocated
    second = subprocess.run(daemon.argv, cwd=ROOT, env=daemon.env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert f"another stagevisor daemon (pid {daemon.pid}) holds" in second.stderr
    assert daemon.status()["state"] == "SERVING"


def test_watch_events_streams_the_transitions_of_a_restart():
    with DaemonProcess(colocated_pipeline()) as daemon:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.admin_address) as channel:
            stub = admin_pb2_grpc.AdminStub(channel)
            events = stub.WatchEvents(admin_pb2.WatchEventsRequest(), timeout=60)
            events.initial_metadata()  # the daemon has subscribed this stream
            # --force: stopped first (the plan's GPU stages declare no fractions, so none starts beside it).
            reply = stub.RestartGroup(admin_pb2.RestartGroupRequest(name="pipeline", force=True), timeout=60)
            seen, times = [], {}
            for event in events:
                seen.append((event.old_state, event.new_state))
                times[event.new_state] = event.time
                if event.new_state == "READY":
                    break
            events.cancel()
        assert seen == [("READY", "STOPPING"), ("STOPPING", "STOPPED"), ("STOPPED", "STARTING"), ("STARTING", "READY")]
        assert reply.new_pid != reply.old_pid
        # The READY event says where the start went; its phases fit between STARTING and READY.
        phases = re.fullmatch(
            r"started in (\d+\.\d{3})s: launch [\d.]+s, interpreter [\d.]+s, imports [\d.]+s, "
            r"build [\d.]+s, serve [\d.]+s, handshake [\d.]+s; worker cpu [\d.]+s",
            event.reason,
        )
        assert phases, event.reason
        assert 0 < float(phases.group(1)) <= times["READY"] - times["STARTING"] + 0.001


def test_cli_reports_when_no_daemon_is_reachable(tmp_path):
    address = f"unix:{tmp_path / 'none.sock'}"
    for command in (["topology"], ["status"], ["restart", "x"], ["stop"]):
        result = subprocess.run(
            [sys.executable, "-m", "stagevisor", *command, "--admin-address", address],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1
        assert result.stderr.strip() == f"error: no stagevisor daemon at {address}; start one with stagevisor serve"


def test_worker_that_dies_while_building_fails_startup_pointing_at_its_output():
    plan = colocated_pipeline(factories={"vocoder": "tests.integration.daemon_stages:make_crash_on_build"})
    with DaemonProcess(plan) as daemon:
        assert daemon.wait_exit(90) == 1
        assert "died during initialization (exit code 3); see its output in the daemon log" in daemon.log()


def test_building_the_cli_parser_does_not_import_grpc():
    code = "import sys, supervisor.cli as c; c.build_parser(); print('grpc' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "False", result.stderr


def test_systemd_is_notified_ready_once_serving_and_stopping_on_shutdown(tmp_path):
    import socket

    notify_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(str(notify_path))
        receiver.settimeout(60)
        with DaemonProcess(colocated_pipeline(), env={"NOTIFY_SOCKET": str(notify_path)}) as daemon:
            messages = [receiver.recv(4096).decode()]
            while "READY=1" not in messages[-1].splitlines():
                messages.append(receiver.recv(4096).decode())
            assert daemon.status()["state"] == "SERVING"
            os.kill(daemon.pid, signal.SIGTERM)
            while not any(m.startswith("STOPPING=1") for m in messages):
                messages.append(receiver.recv(4096).decode())
            assert daemon.wait_exit(60) == 0


def test_a_public_address_in_use_fails_with_a_clear_message_before_any_worker_starts():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        daemon = DaemonProcess(colocated_pipeline())
        daemon.argv[daemon.argv.index("--listen") + 1] = address
        with daemon:
            assert daemon.wait_exit(60) == 1
            assert f"error: ADDRESS_IN_USE: cannot listen on {address} (--listen)" in daemon.log()
            assert "STARTING" not in daemon.log()


def test_a_stage_that_never_finishes_building_fails_startup_after_the_start_timeout():
    """One group only, whose stage hangs: however loaded the machine, the group that misses the start
    timeout is that one (with siblings, a slow healthy worker could miss a short timeout first)."""
    plan = colocated_pipeline(factories={"tts_engine": "tests.integration.daemon_stages:make_hanging"})
    with DaemonProcess(plan, "--start-timeout", "3") as daemon:
        assert daemon.wait_exit(90) == 1
        failed = re.search(r"error: STARTUP_FAILED: group 'pipeline' failed to start: worker pid (\d+)", daemon.log())
        assert failed, daemon.log()
        assert "did not report READY within 3s" in daemon.log()
        poll_until(lambda: not alive(int(failed.group(1))), timeout=20, message="the hanging worker is gone")


def test_a_stale_admin_socket_left_by_a_dead_daemon_is_replaced():
    import socket

    daemon = DaemonProcess(colocated_pipeline())
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(daemon.admin_address[len("unix:") :])
    stale.close()  # the file stays, nobody listens: what a SIGKILLed daemon leaves behind
    with daemon:
        assert daemon.wait_serving()["state"] == "SERVING"


def test_events_follows_a_restart_and_ends_when_the_daemon_stops():
    """
    1. `stagevisor events` subscribes (it says so on stderr once the daemon has it);
    2. `restart vocoder --force` shows up as STOPPING -> STOPPED -> STARTING -> READY with the new pid;
    3. `stop` ends the stream and the command exits 0.
    """
    with DaemonProcess(higgs_isolated_audio_encoder()) as daemon:
        daemon.wait_serving()
        out, err = daemon.tmp / "events.out", daemon.tmp / "events.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            events = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "stagevisor",
                    "events",
                    "--format",
                    "json",
                    "--admin-address",
                    daemon.admin_address,
                ],
                cwd=ROOT,
                env=daemon.env,
                stdout=stdout,
                stderr=stderr,
            )
        try:
            poll_until(lambda: "following lifecycle events" in err.read_text(), timeout=60, message="events subscribed")
            restarted = daemon.cli("restart", "vocoder", "--force")  # GPU 0 has no room beside it
            assert restarted.returncode == 0, restarted.stderr
            new_pid = group(daemon.topology(), "vocoder")["pid"]
            assert daemon.cli("stop").returncode == 0
            assert events.wait(timeout=60) == 0, err.read_text()
        finally:
            if events.poll() is None:
                events.kill()
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        # The recent history comes first, marked replayed: vocoder's start, before the restart.
        assert [(e["old_state"], e["new_state"]) for e in lines if e["group"] == "vocoder" and e["replayed"]][:2] == [
            ("STOPPED", "STARTING"),
            ("STARTING", "READY"),
        ]
        vocoder = [(e["old_state"], e["new_state"]) for e in lines if e["group"] == "vocoder" and not e["replayed"]]
        assert vocoder[:4] == [
            ("READY", "STOPPING"),
            ("STOPPING", "STOPPED"),
            ("STOPPED", "STARTING"),
            ("STARTING", "READY"),
        ]
        live = [e for e in lines if not e["replayed"]]
        assert live[[e["group"] for e in live].index("vocoder") + 3]["pid"] == new_pid
        assert {e["new_state"] for e in lines if e["reason"] == "daemon shutdown"} >= {"STOPPING", "STOPPED"}


def test_sigterm_while_a_restarts_new_worker_builds_stops_it_without_waiting_for_its_model(tmp_path):
    """1. A daemon whose stage builds at once the first time; every later build hangs (a model load).
    2. `stagevisor restart pipeline` starts a new worker beside the serving one; it builds.
    3. SIGTERM to the daemon: the building worker has nothing to drain, so it stops on SIGTERM at once and the
       daemon exits without the SIGKILL that ends a worker past
       --stop-timeout (120 s here) or silent for the heartbeat timeout (10 s); the restart is told why.
    """
    marker = tmp_path / "hang"
    hanging = "tests.integration.daemon_stages:make_hanging_once_marked"
    plan = make_plan(
        "demo", [("front", "pipeline", None, None), ("engine", "pipeline", None, None)], factories={"engine": hanging}
    )
    with DaemonProcess(plan, "--stop-timeout", "120", env={"HANG_MARKER": str(marker)}) as daemon:
        daemon.wait_serving()
        marker.touch()
        answers: list[subprocess.CompletedProcess] = []
        restart = threading.Thread(target=lambda: answers.append(daemon.cli("restart", "pipeline", timeout=300)))
        restart.start()
        poll_until(lambda: daemon.log().count("building stage 'engine'") == 2, timeout=120, message="a second build")
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait_exit(60) == 0, daemon.log()
        restart.join(timeout=60)
        assert "sending SIGKILL" not in daemon.log(), daemon.log()
    assert answers and answers[0].returncode == 1, answers
    assert "stopped while its new worker started" in answers[0].stderr, answers[0].stderr


def test_a_new_replica_that_dies_while_it_builds_is_reported_to_scale_pointing_at_the_daemon_log(tmp_path):
    """`stagevisor scale` (as apply and restart) answers with the daemon's words for a new worker that died while
    it built: they pointed at "its output above", which the CLI's operator does not have; its output is in the
    daemon log."""
    marker = tmp_path / "crash"
    crashing = "tests.integration.daemon_stages:make_crash_once_marked"
    plan = make_plan(
        "demo", [("front", "pipeline", None, None), ("engine", "pipeline", None, None)], factories={"engine": crashing}
    )
    with DaemonProcess(plan, env={"CRASH_MARKER": str(marker)}) as daemon:
        daemon.wait_serving()
        marker.touch()
        result = daemon.cli("scale", "pipeline=2", timeout=300)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "died during initialization (exit code 3); see its output in the daemon log" in result.stderr
        assert "building stage 'engine'" in daemon.log()  # where the message points: the worker's own lines
