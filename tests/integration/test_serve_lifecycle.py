"""The operator's path on real model declarations: serve, restart, crashes mid-request, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import grpc
import pytest

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc
from tests.integration.daemon_helpers import (
    NOISELESS,
    ROOT,
    ServeProcess,
    alive,
    daemon_env,
    descendants,
    poll_until,
    synthesize,
    worker_pids,
)

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

LONG_TEXT = " ".join(["The vocoder decodes latent frames into speech while the engine keeps generating."] * 12)
HIGGS_AUDIO_ENCODER = ("--model-path", "bosonai/higgs-tts-3-4b", "--isolate-stage", "audio_encoder", "--stand-ins")


def group(topology: dict, name: str) -> dict:
    return next(g for g in topology["groups"] if g["name"] == name)


def speak(address: str, text: str = "Back again.") -> bytes:
    return synthesize(address, text)[0]


@pytest.fixture
def higgs():
    with ServeProcess(*HIGGS_AUDIO_ENCODER) as daemon:
        daemon.wait_serving()
        yield daemon


@pytest.fixture(scope="module")
def higgs_as_started():
    """One daemon for the tests that only read from it (marked worker_torch: one of them checks torch)."""
    with ServeProcess(*HIGGS_AUDIO_ENCODER) as daemon:
        daemon.wait_serving()
        yield daemon


@pytest.mark.worker_torch
def test_higgs_with_isolated_audio_encoder_runs_one_worker_per_planned_group(higgs_as_started):
    higgs = higgs_as_started
    topology = higgs.topology()
    assert [(g["name"], g["stages"]) for g in topology["groups"]] == [
        ("tts_frontend", ["preprocessing"]),
        ("audio_encoder", ["audio_encoder"]),
        ("pipeline", ["tts_engine"]),
        ("vocoder", ["vocoder"]),
    ]
    assert [g["total_gpu_memory_fraction"] for g in topology["groups"]] == [None, 0.03, 0.85, 0.1]
    assert all(g["fraction_enforced"] is False for g in topology["groups"])  # no CUDA here
    assert sorted(worker_pids(higgs.pid)) == sorted(g["pid"] for g in topology["groups"])


def test_restart_group_replaces_its_worker_and_speech_goes_on(higgs):
    before = speak(higgs.listen)
    old = group(higgs.topology(), "audio_encoder")["pid"]
    result = higgs.cli("restart", "audio_encoder", "--force")  # GPU 0 (0.98) has no room beside it
    assert result.returncode == 0, result.stderr
    new = group(higgs.topology(), "audio_encoder")["pid"]
    assert new != old and not alive(old)
    assert speak(higgs.listen) == before


def test_worker_killed_mid_request_ends_it_unavailable_and_the_group_comes_back(higgs):
    expected = speak(higgs.listen)
    victim = group(higgs.topology(), "vocoder")["pid"]
    with grpc.insecure_channel(higgs.listen) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        stream = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=LONG_TEXT, options=NOISELESS), timeout=60)
        next(stream)  # the vocoder is streaming: the request is in flight
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as failure:
            for _ in stream:
                pass
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE, failure.value.details()
    assert "vocoder" in failure.value.details()

    def back():
        g = group(higgs.admin_topology(), "vocoder")
        return g["state"] == "READY" and g["pid"] not in (victim, None) and g

    assert poll_until(back, timeout=60, message="vocoder group READY again")["restarts"] == 1
    assert speak(higgs.listen) == expected


def test_sigterm_drains_and_leaves_no_process_behind(higgs):
    workers = higgs.track()
    assert len(workers) >= 4
    higgs.proc.send_signal(signal.SIGTERM)
    assert higgs.wait_exit(timeout=60) == 0
    poll_until(lambda: not any(alive(pid) for pid in workers), timeout=10, message="workers gone")


def test_sigkill_of_the_daemon_leaves_no_worker_alive():
    with ServeProcess("--model-path", "ming-omni-tts", "--isolate-stage", "vocoder", "--stand-ins") as daemon:
        daemon.wait_serving()
        workers = worker_pids(daemon.pid)
        assert len(workers) == 2
        daemon.proc.kill()
        daemon.wait_exit(timeout=10)
        poll_until(lambda: not any(alive(pid) for pid in workers), timeout=10, message="orphaned workers exit")


def test_invalid_placement_exits_2_before_any_worker_starts(tmp_path):
    never = tmp_path / "never"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "serve",
            "--model-path",
            "qwen3-tts",
            "--isolate-stage",
            "preprocessing",
            "--admin-address",
            f"unix:{never}/admin.sock",
        ],
        cwd=ROOT,
        env=daemon_env(never / "run"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "'preprocessing' -> 'tts_engine'" in result.stderr
    assert not never.exists(), "serve created its runtime or admin socket directory before validating"


def test_sigterm_refuses_new_requests_and_drains_the_one_in_flight():
    """
    1. a long request is streaming when the daemon gets SIGTERM;
    2. a request sent after SIGTERM is refused at once with UNAVAILABLE;
    3. the request in flight still completes, then the daemon exits 0.
    """
    with ServeProcess("--isolate-stage", "vocoder", "--drain-timeout", "60") as daemon:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.listen) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            stream = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=LONG_TEXT, options=NOISELESS), timeout=120)
            first = next(stream)
            daemon.proc.send_signal(signal.SIGTERM)
            poll_until(
                lambda: (daemon.admin_status() or {}).get("state") != "SERVING",
                timeout=30,
                message="daemon leaves SERVING",
            )
            with pytest.raises(grpc.RpcError) as refused:
                for _ in stub.Synthesize(
                    synthesis_pb2.SynthesizeRequest(text="Too late.", options=NOISELESS), timeout=30
                ):
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            drained = first.pcm + b"".join(chunk.pcm for chunk in stream)
        assert len(drained) > 20 * 24000 * 2  # the whole long text, not a truncated stream
        assert daemon.wait_exit(timeout=90) == 0


def test_sigterm_to_the_whole_process_group_still_drains_the_request_in_flight():
    """`kill -- -PGID`, `timeout`, systemd's default KillMode: the daemon, its fork server and both workers get
    SIGTERM at once. The fork server lives on (it used to die and take every forked worker with it, failing the
    request as UNAVAILABLE), each worker finishes what it holds, and the daemon exits 0."""
    daemon = ServeProcess("--isolate-stage", "vocoder", "--drain-timeout", "60")
    daemon.new_session = True  # its own process group, so that the signal reaches no test process
    with daemon:
        daemon.wait_serving()
        with grpc.insecure_channel(daemon.listen) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            stream = stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=LONG_TEXT, options=NOISELESS), timeout=120)
            first = next(stream)
            os.killpg(daemon.pid, signal.SIGTERM)
            drained = first.pcm + b"".join(chunk.pcm for chunk in stream)
        assert len(drained) > 20 * 24000 * 2  # the whole long text, not a truncated stream
        assert daemon.wait_exit(timeout=90) == 0
        assert "exited unexpectedly" not in daemon.log()


def test_the_next_daemon_sweeps_what_a_sigkilled_one_left_behind():
    """
    1. a request with a large reference clip puts buffers in /dev/shm;
    2. the daemon is SIGKILLed: its workers die with it, nobody cleans up;
    3. the next daemon on the same runtime directory removes the dead ones' buffers and socket directory.
    """
    with ServeProcess("--model-path", "higgs-tts", "--stand-ins") as first:
        first.wait_serving()
        pids = [first.pid, *worker_pids(first.pid)]
        with grpc.insecure_channel(first.listen) as channel:
            request = synthesis_pb2.SynthesizeRequest(text="Hi.", reference_audio=b"\x01" * (1 << 19))
            with pytest.raises(grpc.RpcError):  # not a WAV: refused, after crossing the data plane
                list(synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=60))
        left = [p for p in os.listdir("/dev/shm") if p.startswith("stagevisor-") and int(p.split("-")[2]) in pids]
        assert left, "the request should have used shared memory"
        first.proc.kill()
        first.wait_exit(timeout=10)
        poll_until(lambda: not any(alive(pid) for pid in pids), timeout=10, message="workers gone")
        run_dir = first.env["STAGEVISOR_RUNTIME_DIR"]
        assert os.path.isdir(f"{run_dir}/d{first.pid}")
        with ServeProcess("--model-path", "demo", env={"STAGEVISOR_RUNTIME_DIR": run_dir}) as second:
            second.wait_serving()
            assert not [p for p in left if os.path.exists(f"/dev/shm/{p}")]
            assert not os.path.exists(f"{run_dir}/d{first.pid}")


def loads_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


@pytest.mark.worker_torch
@pytest.mark.torch
def test_only_workers_of_gpu_groups_import_torch(higgs_as_started):
    """The daemon never loads torch, nor does its fork server; a worker loads it only to bind a GPU stage's device."""
    higgs = higgs_as_started
    groups = {g["name"]: g for g in higgs.topology()["groups"]}
    assert not loads_torch(higgs.pid)
    assert all(loads_torch(g["pid"]) for g in groups.values() if g["gpu"] is not None)
    helpers = set(descendants(higgs.pid)) - set(worker_pids(higgs.pid))
    assert helpers and not any(loads_torch(pid) for pid in helpers)  # the fork server, the resource tracker
    with ServeProcess("--model-path", "demo", "--isolate-stage", "vocoder") as cpu_only:
        cpu_only.wait_serving()
        assert not any(loads_torch(pid) for pid in [cpu_only.pid, *descendants(cpu_only.pid)])
