"""`stagevisor bench` on real daemons: topologies side by side, invalid ones reported, clean stops, honest numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from tests.integration import exec_as
from tests.integration.daemon_helpers import ROOT, ServeProcess, poll_until
from tests.integration.limit_stages import pipeline_config

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow


def shm_files_of(pids: list[int]) -> list[str]:
    """Shared-memory files whose names carry one of `pids` (daemons and workers name segments by pid)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return [name for name in names if any(f"-{pid}-" in name for pid in pids)]


def wait_until_measuring(in_flight: Callable[[], int | None]) -> None:
    """Wait (bounded) until the daemon holds two requests at once (`in_flight`: how many it holds now, None while it
    does not answer): a bench at --concurrency 2 is then measuring, with requests in flight; its warm-up sends one
    at a time."""
    poll_until(
        lambda: (in_flight() or 0) >= 2, timeout=120, interval=0.1, message="two requests of the measurement in flight"
    )


def bench_in_flight(tmp_path: Path) -> int:
    """The requests the daemon of a bench run with TMPDIR=`tmp_path` holds now (its admin API's GetStatus);
    0 while there is none or it does not answer."""
    import grpc

    from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc

    admin_socket = next(tmp_path.glob("svbench*/admin.sock"), None)
    if admin_socket is None:
        return 0
    try:
        with grpc.insecure_channel(f"unix:{admin_socket}") as channel:
            return admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest(), timeout=10).in_flight
    except grpc.RpcError:
        return 0


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
    return subprocess.run(
        [sys.executable, "-m", "stagevisor", "bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_three_topologies_of_a_seed_model_with_one_invalid(tmp_path):
    plot = tmp_path / "bench.png"
    result = bench(
        "--model-path",
        "moss-tts-delay",
        "--stand-ins",
        "--topology",
        "declared",
        "--topology",
        "--isolate-stage vocoder",
        "--topology",
        "--isolate-stage tts_engine",
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--warmup",
        "1",
        "--check-identical",
        "--format",
        "json",
        "--plot",
        str(plot),
        tmp_path=tmp_path,
    )
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
    pids = [*declared["groups"].values(), *isolated["groups"].values(), declared["daemon_pid"], isolated["daemon_pid"]]
    assert [
        pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ] == []
    assert not list(tmp_path.glob("svbench*"))
    assert shm_files_of(pids) == []


def test_ctrl_c_stops_every_daemon_and_worker_it_started(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    bench = [
        sys.executable,
        "-m",
        "stagevisor",
        "bench",
        "--model-path",
        "demo",
        "--topology",
        "--isolate-stage vocoder",
        "--requests",
        "200",
        "--concurrency",
        "2",
    ]
    proc = subprocess.Popen(
        # Ctrl-C as a terminal delivers it, whatever this test process inherited or was left with: a bench that
        # inherits SIGINT ignored keeps ignoring it (CI's runs on this session's main measured all 200 requests,
        # 32 s, and exited 0, where a run on its own stops at the interrupt). Set by exec_as, not preexec_fn.
        exec_as.command(bench, default_sigint=True),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        bench_process = psutil.Process(proc.pid)

        def measuring_with_workers():
            family = bench_process.children(recursive=True)
            return family if len(family) >= 3 and list(tmp_path.glob("svbench*/admin.sock")) else None

        family = poll_until(measuring_with_workers, timeout=180, interval=0.2, message="a daemon with two workers")
        # The interrupt lands with requests in flight.
        wait_until_measuring(lambda: bench_in_flight(tmp_path))
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


def test_its_numbers_agree_with_what_a_minimal_client_receives_for_the_same_requests(tmp_path):
    """Same daemon, same text, noise off: the audio it counts is what a bare gRPC client receives; its figures add up.

    No timing is compared between the two clients (this machine is shared and noisy): the audio is
    deterministic, and the report's rates must be its own counts over its own wall time.
    """
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    text = "The quick brown fox jumps over the lazy dog."
    texts = tmp_path / "texts.txt"
    texts.write_text(text + "\n")
    with ServeProcess("--model-path", "demo") as daemon:
        daemon.wait_serving()
        result = bench(
            "--address",
            daemon.listen,
            "--text-file",
            str(texts),
            "--concurrency",
            "1",
            "--requests",
            "6",
            "--warmup",
            "1",
            "--option",
            "seed=0",
            "--format",
            "json",
            tmp_path=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        row = json.loads(result.stdout)["topologies"][0]["rows"][0]
        with grpc.insecure_channel(daemon.listen) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            request = synthesis_pb2.SynthesizeRequest(text=text, options={"seed": "0"})
            chunks = list(stub.Synthesize(request, timeout=120))
    samples = sum(len(chunk.pcm) // 2 for chunk in chunks)  # 16-bit PCM
    rate = next(chunk.sample_rate for chunk in chunks if chunk.sample_rate)
    assert samples > 0
    wall = row["wall_seconds"]
    assert row["requests"] == 6 and row["errors"] == {}
    assert row["requests_per_second"] * wall == pytest.approx(6)
    assert row["audio_seconds_per_second"] * wall == pytest.approx(6 * samples / rate)
    assert 0 < row["ttfa"]["p50"] <= row["ttfa"]["p90"] <= row["ttfa"]["p99"]
    assert row["ttfa"]["p50"] <= row["latency"]["p50"] <= row["latency"]["p99"] <= wall
    # The median request's time over its audio: no request took longer than the slowest one.
    assert 0 < row["real_time_factor"] * samples / rate <= row["latency"]["p99"] + 1e-9


def test_repeats_give_medians_with_their_spread_the_load_of_each_run_and_call_a_difference_within_it_so(tmp_path):
    """Two topologies of the demo, two interleaved runs each: every figure a median of its runs with their
    min-max, each run's load average, the machine's CPUs, and "within the spread" exactly where the two
    topologies' ranges overlap, in the JSON's summary and in the table made from it."""
    from stagevisor.supervisor.bench.results import SPREAD_METRICS
    from stagevisor.supervisor.bench.table import print_table

    result = bench(
        "--model-path",
        "demo",
        "--topology",
        "declared",
        "--topology",
        "--isolate-stage vocoder",
        "--concurrency",
        "1,2",
        "--requests",
        "3",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--format",
        "json",
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["workload"]["repeats"] == 2
    machine = report["machine"]
    assert machine["cpus"] >= 1 and 1 <= machine["usable_cpus"] <= machine["cpus"]
    assert len(machine["load_average"]) == 3 and len(machine["load_average_after"]) == 3
    declared, isolated = report["topologies"]
    for topology in (declared, isolated):
        for row in topology["rows"]:
            assert row["errors"] == {} and row["requests"] == 2 * 3  # both runs' requests
            assert len(row["repeats"]) == 2 and all(run["load_average_1m"] >= 0 for run in row["repeats"])
            for name in SPREAD_METRICS:
                values = [run[name] for run in row["repeats"]]
                low, high = row["spread"][name]
                assert (low, high) == (min(values), max(values))
                median = row[name[:-4]]["p50"] if name.endswith("_p50") else row[name]  # ttfa_p50: row["ttfa"]["p50"]
                assert median == pytest.approx(sum(values) / 2)  # the median of two runs
    for mine, theirs in zip(isolated["rows"], declared["rows"], strict=True):
        for name in SPREAD_METRICS:
            (a, b), (c, d) = mine["spread"][name], theirs["spread"][name]
            assert mine["within_spread"][name] is (a <= d and c <= b)
    first, low, high = report["summary"][0], isolated["rows"][0], isolated["rows"][-1]
    noise = "(within the spread of 2 runs: not a measured difference)"
    rps, ttfa = first.split(", ")
    assert (noise in rps) is high["within_spread"]["requests_per_second"]
    assert (noise in ttfa) is low["within_spread"]["ttfa_p50"]
    # the table made from this report (what --format table prints): medians with (min-max), the legend when due
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_table(report)
    table = out.getvalue()
    assert table.startswith("medians of 2 interleaved runs per point, (min-max) over the runs")
    low_rps = declared["rows"][0]["spread"]["requests_per_second"]
    assert f"({low_rps[0]:.2f}-{low_rps[1]:.2f})" in table
    any_within = any(any(row["within_spread"].values()) for row in isolated["rows"])
    assert ("~: the difference from the first topology is within the spread" in table) is any_within
    assert f"machine: {machine['usable_cpus']} of {machine['cpus']} CPUs usable; load average" in table


def test_a_daemon_that_dies_during_the_measurement_fails_its_topology_at_once(tmp_path):
    """The daemon killed mid-measurement: bench sent requests to its socket until --duration ran out (86022
    UNAVAILABLE in 12 s), then reported the dead daemon's figures, "best for throughput", and exited 0.

    1. bench measures the demo for up to 120 s
    2. its daemon is killed with SIGKILL once it measures
    3. bench stops at once: exit 1, the topology DAEMON_FAILED, naming the signal
    """
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    log = tmp_path / "bench.err"
    with open(log, "w") as stderr_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stagevisor", "bench", "--model-path", "demo", "--duration", "120"]
            + ["--concurrency", "2", "--warmup", "1", "--format", "json"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
        )
    try:
        bench_process = psutil.Process(proc.pid)

        def measuring_daemon():
            daemons = bench_process.children()
            return daemons[0] if daemons and "bench: measuring" in log.read_text() else None

        daemon = poll_until(measuring_daemon, timeout=180, interval=0.2, message="bench measuring its daemon")
        # Past the warm-up request, into the measurement.
        wait_until_measuring(lambda: bench_in_flight(tmp_path))
        killed_at = time.monotonic()
        daemon.send_signal(signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=100)  # well before --duration would end it
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = log.read_text()
    assert proc.returncode == 1, stderr
    assert time.monotonic() - killed_at < 100
    assert "during the measurement, the daemon was killed by SIGKILL" in stderr
    (topology,) = json.loads(stdout)["topologies"]
    assert topology["error"]["code"] == "DAEMON_FAILED"
    assert not list(tmp_path.glob("svbench*"))
    # The killed daemon could not remove its shared-memory area; the bench that started it does.
    assert [p.name for p in Path("/dev/shm").glob(f"stagevisor-{os.getuid()}-{daemon.pid}-*")] == []


LIMITS_CONFIG = pipeline_config("bench-address")


def test_a_daemon_at_an_address_that_dies_during_the_measurement_fails_its_run_at_once(tmp_path):
    """`bench --address` against a daemon killed mid-run: exit 0, "error": null, and tens of thousands of requests
    failing UNAVAILABLE at once, one after another, until --duration ran out.

    1. a daemon serves; bench measures it at --address for up to 120 s
    2. the daemon is killed with SIGKILL once bench measures
    3. bench stops within its reconnect wait: exit 1, DAEMON_FAILED naming the address
    """
    config = tmp_path / "pipeline.yaml"
    config.write_text(LIMITS_CONFIG)
    texts = tmp_path / "texts.txt"
    texts.write_text("Hello.\n")
    log = tmp_path / "bench.err"
    with ServeProcess("--config", str(config)) as daemon:
        daemon.wait_serving()
        daemon.track()
        with open(log, "w") as stderr_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "stagevisor", "bench", "--address", daemon.listen, "--duration", "120"]
                + ["--text-file", str(texts), "--concurrency", "2", "--warmup", "1", "--format", "json"],
                cwd=ROOT,
                env={**os.environ, "TMPDIR": str(tmp_path)},
                stdout=subprocess.PIPE,
                stderr=stderr_file,
                text=True,
            )
        try:
            poll_until(lambda: "bench: measuring" in log.read_text(), timeout=60, message="bench measuring")
            wait_until_measuring(lambda: (daemon.admin_status() or {}).get("in_flight"))  # into the measurement
            killed_at = time.monotonic()
            os.kill(daemon.pid, signal.SIGKILL)
            stdout, _ = proc.communicate(timeout=60)  # well before --duration would end it
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = log.read_text()
    assert proc.returncode == 1, stderr
    assert time.monotonic() - killed_at < 60
    (topology,) = json.loads(stdout)["topologies"]
    assert topology["error"]["code"] == "DAEMON_FAILED"
    assert f"the daemon at {daemon.listen} does not answer" in topology["error"]["message"]
