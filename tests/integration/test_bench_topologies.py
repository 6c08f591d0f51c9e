"""`stagevisor bench` against real daemons: topologies side by side, invalid ones reported, clean stops, honest numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.integration.daemon_helpers import ROOT, ServeProcess, poll_until


def shm_files_of(pids: list[int]) -> list[str]:
    """Shared-memory files whose names carry one of `pids` (daemons and workers name segments by pid)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return [name for name in names if any(f"-{pid}-" in name for pid in pids)]


import pytest


@pytest.fixture
def tmp_path():
    """A short temporary directory (unix socket paths are limited), removed after the test."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="svt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def bench(*args: str, tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "stagevisor", "bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_three_topologies_of_a_seed_model_with_one_invalid(tmp_path):
    plot = tmp_path / "bench.png"
    result = bench("--model-path", "qwen3-tts", "--topology", "declared", "--topology", "--isolate-stage vocoder",
                   "--topology", "--isolate-stage tts_engine", "--concurrency", "1,2", "--requests", "2",
                   "--warmup", "1", "--check-identical", "--format", "json", "--plot", str(plot), tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    declared, isolated, invalid = report["topologies"]
    assert invalid["error"]["code"] == "UNSAFE_EDGE" and invalid["rows"] == []
    assert "topology `--isolate-stage tts_engine`: UNSAFE_EDGE" in result.stderr
    for topology in (declared, isolated):
        assert [row["concurrency"] for row in topology["rows"]] == [1, 2]
        for row in topology["rows"]:
            assert row["errors"] == {} and row["requests"] == 2 and row["ttfa"]["p50"] > 0
            assert row["requests_per_second"] > 0 and row["ratios"]["requests_per_second"] > 0
    assert list(isolated["groups"]) == ["pipeline", "vocoder"]
    assert isolated["rows"][0]["resources"]["vocoder"]["cpu_seconds"] > 0
    assert report["identical"] == {"identical": True, "differing": []}
    assert report["summary"][0].startswith("`--isolate-stage vocoder` against `declared`: ")
    assert plot.read_bytes()[:4] == b"\x89PNG"
    # Nothing left behind: workers, daemons, sockets, shared memory.
    pids = [*declared["groups"].values(), *isolated["groups"].values(), declared["daemon_pid"],
            isolated["daemon_pid"]]
    assert [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] == []
    assert not list(tmp_path.glob("svbench*"))
    assert shm_files_of(pids) == []


def test_ctrl_c_stops_every_daemon_and_worker_it_started(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "stagevisor", "bench", "--model-path", "demo",
                             "--topology", "--isolate-stage vocoder", "--requests", "200", "--concurrency", "2"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        bench_process = psutil.Process(proc.pid)

        def measuring_with_workers():
            family = bench_process.children(recursive=True)
            return family if len(family) >= 3 and list(tmp_path.glob("svbench*/admin.sock")) else None

        family = poll_until(measuring_with_workers, timeout=180, interval=0.2, message="a daemon with two workers")
        time.sleep(1.0)  # let requests be in flight when the interrupt lands
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted; every daemon it started is stopped" in stderr
    gone, alive = psutil.wait_procs(family, timeout=30)
    assert alive == []
    assert not list(tmp_path.glob("svbench*"))


def test_its_numbers_agree_with_a_minimal_client_timing_the_same_requests(tmp_path):
    """Same daemon, same texts, one client at a time: requests/s and first audio within a noisy-machine tolerance."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    texts = tmp_path / "texts.txt"
    texts.write_text("The quick brown fox jumps over the lazy dog.\n")
    with ServeProcess("--model-path", "demo") as daemon:
        daemon.wait_serving()
        result = bench("--address", daemon.listen, "--text-file", str(texts), "--concurrency", "1",
                       "--requests", "6", "--warmup", "1", "--format", "json", tmp_path=tmp_path)
        assert result.returncode == 0, result.stderr
        row = json.loads(result.stdout)["topologies"][0]["rows"][0]
        firsts = []
        with grpc.insecure_channel(daemon.listen) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            started = time.perf_counter()
            for _ in range(6):
                sent = time.perf_counter()
                first = None
                for _chunk in stub.Synthesize(synthesis_pb2.SynthesizeRequest(
                        text="The quick brown fox jumps over the lazy dog."), timeout=120):
                    first = first or time.perf_counter() - sent
                firsts.append(first)
            wall = time.perf_counter() - started
    mine_rps = 6 / wall
    mine_ttfa = sorted(firsts)[2:4]
    assert 0.5 < row["requests_per_second"] / mine_rps < 2.0, (row["requests_per_second"], mine_rps)
    mine_median = sum(mine_ttfa) / 2
    assert abs(row["ttfa"]["p50"] - mine_median) < max(0.05, mine_median), (row["ttfa"]["p50"], mine_median)
