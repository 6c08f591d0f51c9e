"""The Ray example of docs/guides/ray.md runs as written: its own two-node cluster, serve pinned to it, stop.

The cluster script (deploy/examples/ray/local_cluster.py) is run as the guide runs it; the daemon is served
with the guide's flags and the repository's deploy/examples/ray/nodes.yaml; the script's SIGTERM stops its
two nodes and nothing else.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="the `ray` extra is not installed")

from tests.integration.daemon_helpers import ROOT, ServeProcess, alive, poll_until, synthesize  # noqa: E402

pytestmark = pytest.mark.slow
GUIDE = ROOT / "docs" / "guides" / "ray.md"
NODES = ROOT / "deploy" / "examples" / "ray" / "nodes.yaml"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_the_guides_commands_use_the_files_and_flags_this_test_runs():
    text = GUIDE.read_text()
    assert "python deploy/examples/ray/local_cluster.py --env-file ray.env &" in text
    assert "--config deploy/examples/ray/nodes.yaml --isolate-stage vocoder --launcher ray" in text
    assert "kill %1" in text


def test_the_ray_example_serves_on_its_own_two_node_cluster_and_stops_only_it(tmp_path):
    env_file = tmp_path / "ray.env"
    cluster = subprocess.Popen(
        [sys.executable, "deploy/examples/ray/local_cluster.py", "--env-file", str(env_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        poll_until(lambda: env_file.exists() or cluster.poll() is not None, timeout=240, message="the cluster's env")
        assert cluster.poll() is None, cluster.stdout.read() if cluster.stdout else ""
        ray_env = dict(re.findall(r"^export (\w+)=(\S+)$", env_file.read_text(), re.M))
        assert set(ray_env) == {"RAY_ADDRESS", "RAY_TMPDIR"}
        args = ("--config", str(NODES), "--isolate-stage", "vocoder", "--launcher", "ray")
        with ServeProcess(*args, env=ray_env) as daemon:
            daemon.wait_serving(timeout=300)
            pcm, rate = synthesize(daemon.listen, "Hello from two Ray nodes.")
            assert rate > 0 and len(pcm) > rate  # more than half a second of 16-bit audio
            groups = {g["name"]: g for g in daemon.topology()["groups"]}
            assert {name: g["node"] for name, g in groups.items()} == {"pipeline": "tts-a", "vocoder": "tts-b"}
            assert groups["pipeline"]["node_id"] != groups["vocoder"]["node_id"]
            assert daemon.cli("stop").returncode == 0
            assert daemon.wait_exit(60) == 0
            log = daemon.log()
        assert not ANSI.search(log), "the daemon log holds ANSI colour codes"
        assert re.search(r"READY: 2 process groups, [\d.]+s after serve started", log), log[-3000:]
    finally:
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGTERM)
        output, _ = cluster.communicate(timeout=120)
    assert cluster.returncode == 0, output
    assert "Ray cluster stopped" in output
    assert not os.path.exists(ray_env["RAY_TMPDIR"]) and not env_file.exists()
    raylets = [p for p in _processes() if ray_env["RAY_TMPDIR"] in p[1]]
    assert raylets == [] or not any(alive(pid) for pid, _ in raylets)


def _processes() -> list[tuple[int, str]]:
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        found.append((process.info["pid"], " ".join(process.info["cmdline"] or ())))
    return found
