"""`stagevisor apply` on a live daemon: topology changes under load fail no request, refusals change nothing.

One daemon (the demo) serves gRPC clients that compare every answer with the
audio of a request made at rest, and an HTTP client, while the topology moves:
vocoder isolated, back to the declared topology, then two replicas of the
engine's group. Then refusals under the same load: a stage whose factory
raises, placements the rules refuse (a stage placed twice, a split of an
edge the model does not declare process-safe) and another model.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
from stagevisor.supervisor.admin.servicer import HISTORY_HEADER
from tests.integration.daemon_helpers import HttpSpeech, ServeProcess, SpeechLoad, poll_until, synthesize

# Each test moves a whole topology several times under load: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TEXT = "A topology can change while it speaks."


def speech_load(daemon: ServeProcess) -> SpeechLoad:
    """Two gRPC clients (each answer compared with the one made at rest) and one HTTP client, until stopped."""
    http = HttpSpeech(daemon.url, daemon.model, daemon.voice)
    return SpeechLoad(daemon.listen, TEXT, daemon.expected, grpc_clients=2, http=http, started=2, timeout=180)


def prepare(daemon: ServeProcess) -> None:
    """What the load needs of a serving daemon: its HTTP URL, a model and voice name, the audio at rest."""
    daemon.url = daemon.http_url()
    with urllib.request.urlopen(daemon.url + "/v1/models", timeout=30) as response:
        daemon.model = json.load(response)["data"][0]["id"]
    with urllib.request.urlopen(daemon.url + "/v1/audio/voices", timeout=30) as response:
        daemon.voice = json.load(response)["voices"][0]["id"]
    daemon.expected, _ = synthesize(daemon.listen, TEXT)


@pytest.fixture(scope="module")
def demo():
    with ServeProcess("--model-path", "demo", "--http", "127.0.0.1:0", "--drain-timeout", "30") as daemon:
        daemon.wait_serving(timeout=300)
        prepare(daemon)
        yield daemon


def groups(daemon: ServeProcess) -> dict[str, tuple[tuple[str, ...], int]]:
    """Group name -> (its stages, its replicas) as the running daemon reports them."""
    return {g["name"]: (tuple(g["stages"]), max(1, g.get("replicas") or 1)) for g in daemon.topology()["groups"]}


def pids(daemon: ServeProcess) -> list[int]:
    found = []
    for group in daemon.topology()["groups"]:
        found += [w["pid"] for w in group.get("workers") or [group]]
    return sorted(found)


def apply(daemon: ServeProcess, *args: str) -> str:
    result = daemon.cli("apply", *args, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_dry_run_prints_the_difference_and_changes_nothing(demo):
    before = pids(demo)
    out = apply(demo, "--isolate-stage", "vocoder", "--dry-run")
    assert "+ vocoder: stages vocoder" in out and "dry run: nothing changed" in out
    assert pids(demo) == before


def speech_status(daemon: ServeProcess, voice: str) -> int:
    """The HTTP status of a short speech request for `voice`."""
    body = json.dumps({"model": daemon.model, "input": "Hi.", "voice": voice, "response_format": "pcm"}).encode()
    request = urllib.request.Request(
        daemon.url + "/v1/audio/speech", body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_an_apply_of_a_config_changes_the_voice_names_clients_may_send(demo, tmp_path):
    """Before: `apply --config` with a new `voices` map said "no change" and the new name got 400 voice_not_found;
    now the map is taken (the topology staying as it is), and an entry naming no voice of the model is warned of."""
    named, unknown, none = (tmp_path / name for name in ("named.yaml", "unknown.yaml", "none.yaml"))
    named.write_text("model_path: demo\nvoices:\n  narrator: heart\n")
    unknown.write_text("model_path: demo\nvoices:\n  narrator: heart\n  reader: nobody\n")
    none.write_text("model_path: demo\n")
    assert speech_status(demo, "narrator") == 400
    before = pids(demo)
    out = apply(demo, "--config", str(named))
    assert "no change: the running topology already is this plan" in out
    assert "+ narrator -> heart" in out and "applied: clients may send the new voice names" in out
    assert speech_status(demo, "narrator") == 200
    with urllib.request.urlopen(demo.url + "/v1/audio/voices", timeout=30) as response:
        assert "narrator" in {voice["id"] for voice in json.load(response)["voices"]}
    warned = demo.cli("apply", "--config", str(unknown), timeout=600)
    assert warned.returncode == 0 and "+ reader -> nobody" in warned.stdout
    assert "warning: the config's `voices` maps 'reader' onto 'nobody', which is not a voice" in warned.stderr
    out = apply(demo, "--config", str(none))
    assert "- narrator (stood for heart)" in out
    assert speech_status(demo, "narrator") == 400
    assert pids(demo) == before  # no worker restarted for it


def test_topology_changes_under_load_fail_no_request_and_keep_the_audio(demo):
    declared = groups(demo)
    with speech_load(demo) as load:
        out = apply(demo, "--isolate-stage", "vocoder")
        assert "split pipeline into: pipeline, vocoder" in out and "applied" in out
        assert groups(demo) == {"pipeline": (("preprocessing", "tts_engine"), 1), "vocoder": (("vocoder",), 1)}
        load.more(2)
        out = apply(demo)
        assert "merged into pipeline: pipeline, vocoder" in out
        assert groups(demo) == declared
        load.more(2)
        apply(demo, "--process-replicas", "pipeline=2")
        assert groups(demo)["pipeline"][1] == 2
        load.more(2)
    print(f"outcomes: {dict(load.outcomes)}")
    assert set(load.outcomes) == {"OK"}, load.outcomes
    log = demo.log()
    assert log.count("apply: done, the daemon runs the new topology") == 3
    assert "apply: new group" not in log.split("apply: done")[-1]  # the new workers report as the daemon's own


UNSAFE_VOCODER_EDGE = """\
pipeline:
  name: demo
  stages:
    - name: preprocessing
      factory: "stagevisor.stages.hibari.executors:preprocessing"
      process: pipeline
      next: [tts_engine]
    - name: tts_engine
      factory: "stagevisor.stages.hibari.executors:tts_engine"
      process: pipeline
      next: [vocoder]
      stream_to: [vocoder]
    - {name: vocoder, factory: "stagevisor.stages.hibari.executors:vocoder", process: pipeline}
  process_safe_edges: [[preprocessing, tts_engine]]
"""
"""The demo's stages declared in full, with the engine -> vocoder handoff not declared process-safe."""


def test_refused_applies_leave_the_running_topology_as_it_was(demo, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "model_path: demo\nstages:\n  - name: vocoder\n    factory: tests.integration.apply_stages:broken\n"
    )
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text(UNSAFE_VOCODER_EDGE)
    before = (groups(demo), pids(demo))
    with speech_load(demo) as load:
        result = demo.cli("apply", "--config", str(broken), timeout=600)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "apply refused" in result.stderr and "nothing changed" in result.stderr
        result = demo.cli("apply", "--stage-process", "vocoder=pipeline", "--isolate-stage", "vocoder")
        assert result.returncode == 2 and "DUPLICATE_ASSIGNMENT" not in result.stdout, result.stderr
        assert "placed twice" in result.stderr
        result = demo.cli("apply", "--config", str(unsafe), "--isolate-stage", "vocoder")
        assert result.returncode == 2, result.stdout + result.stderr
        assert "'tts_engine' -> 'vocoder' cannot cross a process boundary" in result.stderr
        result = demo.cli("apply", "--model-path", "fishaudio/s2-pro")
        assert result.returncode == 2 and "apply changes its topology, not its model" in result.stderr
        load.more(2)
    assert (groups(demo), pids(demo)) == before
    assert set(load.outcomes) == {"OK"}, load.outcomes
    with urllib.request.urlopen(demo.url + "/metrics", timeout=30) as response:
        metrics = response.read().decode()
    # The daemon refused two (the CLI refused the other two before dialling): counted, and on the event stream.
    assert 'stagevisor_topology_applies_total{outcome="refused"} 2.0' in metrics
    assert 'stagevisor_topology_applies_total{outcome="applied"} 3.0' in metrics
    with grpc.insecure_channel(demo.admin_address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        events = stub.WatchEvents(admin_pb2.WatchEventsRequest(), timeout=60, metadata=((HISTORY_HEADER, "1"),))
        refusals = itertools.islice((e for e in events if e.kind == "WARNING" and not e.group), 2)
        reasons = [event.reason for event in refusals]
        events.cancel()
    assert reasons[0].startswith("apply refused: the new topology did not start"), reasons
    assert reasons[1].startswith("apply refused: INVALID_CONFIG: the daemon serves 'demo'"), reasons


GPU_CONFIG = """\
model_path: demo
stages:
  - name: tts_engine
    gpu: 0
    runtime: {resources: {total_gpu_memory_fraction: 0.5}}
  - name: vocoder
    gpu: 0
    runtime: {resources: {total_gpu_memory_fraction: 0.4}}
"""


def test_a_switch_that_would_not_fit_its_gpu_is_refused_under_load(tmp_path):
    """The demo declared on GPU 0 (0.9 of it; it runs on the CPU here): isolating the vocoder fits on its own,
    but both topologies at once would need 1.8 of GPU 0, so the daemon refuses and keeps serving."""
    config = tmp_path / "gpu.yaml"
    config.write_text(GPU_CONFIG)
    with ServeProcess("--config", str(config), "--http", "127.0.0.1:0") as daemon:
        daemon.wait_serving(timeout=300)
        prepare(daemon)
        before = (groups(daemon), pids(daemon))
        with speech_load(daemon) as load:
            result = daemon.cli("apply", "--config", str(config), "--isolate-stage", "vocoder", timeout=600)
            assert result.returncode == 2, result.stdout + result.stderr
            assert "GPU 0 would carry total_gpu_memory_fraction 1.8 while the daemon switches" in result.stderr
            load.more(2)
        assert (groups(daemon), pids(daemon)) == before
    assert set(load.outcomes) == {"OK"}, load.outcomes


def fail_replica(daemon: ServeProcess, name: str) -> None:
    """SIGKILL a replica (the daemon runs --max-restarts 0) and wait until status names it FAILED."""
    group = next(g for g in daemon.topology()["groups"] if g["name"] == name.split("/")[0])
    pid = next(w["pid"] for w in group["workers"] if w["name"] == name)
    os.kill(pid, signal.SIGKILL)

    def failed() -> dict | None:
        status = daemon.status()
        workers = {g["name"]: g["state"] for g in (status or {}).get("groups", [])}
        return status if workers.get(name) == "FAILED" else None

    status = poll_until(failed, timeout=60, interval=0.5, message=f"{name} FAILED")
    assert status["root_cause"]["group"] == name and status["root_cause"]["recovered_at"] is None


def test_status_calls_an_incident_over_once_a_scale_or_an_apply_removed_its_failed_worker():
    """1. Two replicas, restarts off: killing pipeline/1 leaves it FAILED, the root cause an incident now.
    2. `scale pipeline=1` removes it: every worker is READY, so status shows that incident as over.
    3. Two replicas again, pipeline/1 killed again: a new incident.
    4. `apply` replaces the whole topology: that incident is over too.
    """
    with ServeProcess("--model-path", "demo", "--process-replicas", "pipeline=2", "--max-restarts", "0") as daemon:
        daemon.wait_serving(timeout=300)
        fail_replica(daemon, "pipeline/1")
        result = daemon.cli("scale", "pipeline=1", timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        root = daemon.status()["root_cause"]
        assert root["group"] == "pipeline/1" and root["recovered_at"] is not None, root

        result = daemon.cli("scale", "pipeline=2", timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        fail_replica(daemon, "pipeline/1")
        apply(daemon, "--isolate-stage", "vocoder")
        status = daemon.status()
        assert status["state"] == "SERVING" and status["root_cause"]["recovered_at"] is not None, status
        assert "last incident (over" in daemon.cli("status").stdout


def test_a_new_worker_lost_before_the_switch_refuses_the_apply_though_its_recovery_had_it_ready(tmp_path):
    """1. The demo with the vocoder isolated; the vocoder's build waits while a marker file exists.
    2. `apply --process-replicas pipeline=2` (the same config): pipeline/0 and /1 are READY, the vocoder builds.
    3. The new pipeline/0 is killed; its crash recovery has it READY again while the vocoder still builds.
    4. The vocoder builds: the apply is refused naming the lost worker, and the running topology stays.
    """
    config = tmp_path / "held.yaml"
    held = "tests.integration.apply_stages:vocoder_after_marker"
    config.write_text(f"model_path: demo\nstages:\n  - name: vocoder\n    factory: {held}\n")
    marker = tmp_path / "hold"
    placement = ("--config", str(config), "--isolate-stage", "vocoder")
    with ServeProcess(*placement, env={"HOLD_MARKER": str(marker)}) as daemon:
        daemon.wait_serving(timeout=300)
        before = (groups(daemon), pids(daemon))
        marker.touch()
        answers = []
        command = ("apply", *placement, "--process-replicas", "pipeline=2")
        applying = threading.Thread(target=lambda: answers.append(daemon.cli(*command, timeout=600)))
        applying.start()
        # The daemon's line, not the worker's: a worker killed between its READY line and its handshake never
        # served, and would refuse the apply at once.
        ready = "apply: new group 'pipeline/0': STARTING -> READY"
        poll_until(lambda: ready in daemon.log(), timeout=300, message="the new pipeline/0 READY")
        first = re.search(r"\[pipeline/0 pid (\d+)\] stagevisor\.worker: READY", daemon.log())
        assert first, daemon.log()
        os.kill(int(first.group(1)), signal.SIGKILL)
        poll_until(lambda: daemon.log().count(ready) == 2, timeout=300, message="pipeline/0 READY again")
        marker.unlink()
        applying.join(timeout=600)
        assert answers and answers[0].returncode == 1, answers
        refusal = answers[0].stderr
        assert "apply refused: the new topology did not start" in refusal and "nothing changed" in refusal, refusal
        assert f"worker pid {first.group(1)} of group 'pipeline/0' exited unexpectedly" in refusal, refusal
        assert (groups(daemon), pids(daemon)) == before


def test_a_shutdown_while_an_apply_drains_lets_its_requests_finish_and_says_the_daemon_stopped(tmp_path):
    """1. The demo, whose vocoder holds requests while a marker file exists; one request is held there.
    2. `apply --isolate-stage vocoder`: new requests go to the new topology, the held one drains on the old.
    3. SIGTERM, then the marker goes 4 s later (past --stop-timeout): the request ends with all its audio, the
       daemon stops cleanly (no ERROR for the admin call still open), and apply exits 1 saying the new topology
       took over and then the daemon stopped, not that the daemon runs it.
    """
    config = tmp_path / "held.yaml"
    config.write_text(
        "model_path: demo\nstages:\n  - name: vocoder\n    factory: tests.integration.apply_stages:held_vocoder\n"
    )
    marker = tmp_path / "hold"
    serve = ("--config", str(config), "--drain-timeout", "60", "--stop-timeout", "2")
    with ServeProcess(*serve, env={"HOLD_MARKER": str(marker)}) as daemon:
        daemon.wait_serving(timeout=300)
        expected = synthesize(daemon.listen, TEXT)
        marker.touch()
        answers: list[object] = []

        def held_request() -> None:
            try:
                answers.append(synthesize(daemon.listen, TEXT))
            except grpc.RpcError as error:
                answers.append(error)

        requesting = threading.Thread(target=held_request)
        requesting.start()
        poll_until(lambda: os.path.exists(f"{marker}.reached"), timeout=120, message="the request held")
        applied: list[subprocess.CompletedProcess] = []
        command = ("apply", "--config", str(config), "--isolate-stage", "vocoder")
        applying = threading.Thread(target=lambda: applied.append(daemon.cli(*command, timeout=600)))
        applying.start()
        draining = "apply: new requests go to the new topology; draining 1 in flight"
        poll_until(lambda: draining in daemon.log(), timeout=300, message="the apply draining the held request")
        os.kill(daemon.pid, signal.SIGTERM)
        poll_until(lambda: "shutting down (signal SIGTERM)" in daemon.log(), timeout=60, message="the shutdown")
        time.sleep(4.0)  # past --stop-timeout
        marker.unlink()
        requesting.join(timeout=120)
        applying.join(timeout=120)
        assert daemon.wait_exit(timeout=120) == 0, daemon.log()
        log = daemon.log()
    assert answers == [expected], answers
    assert "Traceback" not in log and " ERROR " not in log, log
    assert "apply: done" not in log, log
    assert applied and applied[0].returncode == 1, applied
    assert "the new topology took over (changed pipeline; added vocoder), then the daemon began stopping" in (
        applied[0].stderr
    ), applied[0].stderr
