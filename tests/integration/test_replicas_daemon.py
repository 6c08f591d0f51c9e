"""Replicas of a process group in a real daemon: a killed replica, a rolling restart and live scaling under load.

One daemon per module (the demo with the vocoder isolated and replicated),
driven by client threads that synthesize the same deterministic sentence in
a loop and compare every answer with the audio of a request made at rest.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from stagevisor.supervisor.placement.planner import rescale
from tests.integration.daemon_helpers import (
    DaemonProcess,
    ServeProcess,
    SpeechLoad,
    alive,
    make_plan,
    poll_until,
    synthesize,
    worker_pids,
)

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

TEXT = "Replicas keep speaking while one of them restarts."
CLIENTS = 3


def speech_load(daemon: ServeProcess) -> SpeechLoad:
    """CLIENTS gRPC clients synthesizing TEXT back to back, each answer compared with the one made at rest."""
    return SpeechLoad(daemon.listen, TEXT, daemon.expected, grpc_clients=CLIENTS, started=CLIENTS)


def workers_of(topology: dict, group: str) -> list[dict]:
    entry = next(g for g in topology["groups"] if g["name"] == group)
    return entry.get("workers") or [entry]


@pytest.fixture(scope="module")
def demo():
    with ServeProcess(
        "--model-path", "demo", "--isolate-stage", "vocoder", "--process-replicas", "vocoder=2", "--drain-timeout", "20"
    ) as daemon:
        daemon.wait_serving(timeout=300)  # a shared machine may be loaded many times over
        daemon.expected, _ = synthesize(daemon.listen, TEXT)
        yield daemon


def test_topology_and_status_show_each_replica_with_its_own_pid(demo):
    topology = demo.topology()
    workers = workers_of(topology, "vocoder")
    assert [w["name"] for w in workers] == ["vocoder/0", "vocoder/1"]
    assert all(w["state"] == "READY" and w["pid"] for w in workers)
    group = next(g for g in topology["groups"] if g["name"] == "vocoder")
    assert group["replicas"] == 2 and group["pid"] is None
    assert sorted(worker_pids(demo.pid)) == sorted(
        [w["pid"] for w in workers] + [g["pid"] for g in topology["groups"] if g["name"] != "vocoder"]
    )
    status = demo.status()
    assert [g["name"] for g in status["groups"]] == ["pipeline", "vocoder/0", "vocoder/1"]
    assert status["state"] == "SERVING" and "missing_replicas" not in status


def test_killed_replica_fails_at_most_its_requests_and_returns(demo):
    """1. load on a two-replica vocoder; 2. SIGKILL vocoder/1; 3. it comes back with a new pid;
    4. the others' requests all completed with full audio, at most the held ones failed (UNAVAILABLE)."""
    victim = workers_of(demo.topology(), "vocoder")[1]
    with speech_load(demo) as load:
        before = load.count()
        os.kill(victim["pid"], signal.SIGKILL)
        back = poll_until(
            lambda: next(
                (
                    w
                    for w in workers_of(demo.admin_topology(), "vocoder")
                    if w["name"] == "vocoder/1" and w["state"] == "READY" and w["pid"] != victim["pid"]
                ),
                None,
            ),
            timeout=90,
            message="vocoder/1 back",
        )
        load.more(CLIENTS)
    tally = load.tally()
    print(f"kill under load: {dict(tally)} ({tally['OK'] - before} complete after the kill)")
    assert not alive(victim["pid"]) and back["restarts"] == victim["restarts"] + 1
    assert set(tally) <= {"OK", "UNAVAILABLE"}, tally
    assert tally["UNAVAILABLE"] <= CLIENTS, "more requests failed than the replica could have held"
    assert tally["OK"] > before


def test_rolling_restart_under_load_fails_no_request(demo):
    before = {w["name"]: w["pid"] for w in workers_of(demo.topology(), "vocoder")}
    with speech_load(demo) as load:
        result = demo.cli("restart", "vocoder")
        load.more(CLIENTS)
    tally = load.tally()
    print(f"rolling restart under load: {dict(tally)}")
    assert result.returncode == 0, result.stderr
    after = {w["name"]: w["pid"] for w in workers_of(demo.topology(), "vocoder")}
    assert after.keys() == before.keys() and all(after[n] != before[n] for n in before)
    assert tally == Counter(OK=tally["OK"]), tally


def test_restart_of_one_replica_leaves_the_other(demo):
    before = {w["name"]: w["pid"] for w in workers_of(demo.topology(), "vocoder")}
    result = demo.cli("restart", "vocoder/0")
    assert result.returncode == 0, result.stderr
    assert "restarted group vocoder/0" in result.stdout
    after = {w["name"]: w["pid"] for w in workers_of(demo.topology(), "vocoder")}
    assert after["vocoder/0"] != before["vocoder/0"] and after["vocoder/1"] == before["vocoder/1"]
    again = demo.cli("restart", "vocoder/1", "--format", "json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    now = {w["name"]: w["pid"] for w in workers_of(demo.topology(), "vocoder")}
    assert report == {
        "group": "vocoder/1",
        "old_pid": after["vocoder/1"],
        "new_pid": now["vocoder/1"],
        "state": "READY",
        "workers": [],
    }


def test_scale_up_and_down_under_load_fails_no_request(demo):
    with speech_load(demo) as load:
        up = demo.cli("scale", "vocoder=3")
        load.more(CLIENTS)
        down = demo.cli("scale", "vocoder=2", "--format", "json")
        load.more(CLIENTS)
    tally = load.tally()
    print(f"scale 2 -> 3 -> 2 under load: {dict(tally)}")
    assert up.returncode == 0, up.stderr
    assert re.search(r"2 -> 3 replicas \(vocoder/0 pid \d+, vocoder/1 pid \d+, vocoder/2 pid \d+\)", up.stdout)
    assert down.returncode == 0, down.stderr
    reply = json.loads(down.stdout)
    assert {key: reply[key] for key in ("group", "old_replicas", "new_replicas")} == {
        "group": "vocoder",
        "old_replicas": 3,
        "new_replicas": 2,
    }
    workers = [{"name": w["name"], "pid": w["pid"]} for w in workers_of(demo.topology(), "vocoder")]
    assert reply["workers"] == workers and [w["name"] for w in workers] == ["vocoder/0", "vocoder/1"]
    assert tally == Counter(OK=tally["OK"]), tally


def slow_reader(
    address: str,
    text: str,
    pause: float,
    outcomes: dict[int, tuple[str, float]],
    key: int,
    until: threading.Event | None = None,
) -> None:
    """One request of `text` (seed 0), reading a chunk every `pause` seconds (until `until` is set, if given; then
    at full speed): a slow reader holds it in flight (backpressure) for long. outcomes[key] = ("OK" or
    "CODE: details", when it ended)."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            request = synthesis_pb2.SynthesizeRequest(text=text, options={"seed": "0"})
            for _chunk in synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=150):
                if until is None or not until.is_set():
                    time.sleep(pause)
            outcomes[key] = ("OK", time.monotonic())
        except grpc.RpcError as error:
            outcomes[key] = (f"{error.code().name}: {error.details()}", time.monotonic())


def _concurrent(address: str, n: int) -> list[bytes]:
    """`n` requests at once: least-in-flight routing gives each replica one."""
    results: list[bytes] = [b""] * n

    def one(i: int) -> None:
        results[i], _ = synthesize(address, TEXT)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    return results


def test_scaling_down_a_replicated_group_between_two_others_under_load_fails_no_request():
    """preprocessing -> pipeline (2 replicas) -> vocoder: a replica of the middle group that stops on purpose
    (scaled away) broke its sender's link, and the sender failed every request it had handed on there, those
    still being vocoded downstream too (two or three of about 70 in each round of this load)."""
    text = "The quick brown fox jumps over the lazy dog. A second sentence follows the first one here."
    with ServeProcess(
        "--model-path", "demo", "--isolate-stage", "preprocessing", "--isolate-stage", "vocoder",
        "--process-replicas", "pipeline=2", "--drain-timeout", "20",
    ) as daemon:  # fmt: skip
        daemon.wait_serving(timeout=300)
        expected, _ = synthesize(daemon.listen, text)
        with SpeechLoad(daemon.listen, text, expected, grpc_clients=6, started=6) as load:
            down = daemon.cli("scale", "pipeline=1")
            load.more(6)
            up = daemon.cli("scale", "pipeline=2")
            load.more(6)
        tally = load.tally()
    print(f"middle group scaled 2 -> 1 -> 2 under load: {dict(tally)}")
    assert down.returncode == 0 and up.returncode == 0, down.stderr + up.stderr
    assert tally == Counter(OK=tally["OK"]), tally


def test_a_request_sent_before_its_entry_group_got_replicas_is_drained_when_that_replica_restarts():
    """`scale pipeline=2` then `restart pipeline/0`: the drain of replica 0 waited only for requests routed to it
    after the scale, so a long request sent before it failed (UNAVAILABLE) when its worker stopped."""

    text = " ".join([TEXT] * 60)
    with ServeProcess("--model-path", "demo", "--isolate-stage", "vocoder", "--drain-timeout", "60") as daemon:
        daemon.wait_serving(timeout=300)
        outcomes: dict[int, tuple[str, float]] = {}
        # A chunk every 0.2 s until the restart returned (at one every 0.05 s throughout, the request once ended
        # before a loaded CI machine had scaled and restarted), then at full speed.
        done = threading.Event()
        client = threading.Thread(target=slow_reader, args=(daemon.listen, text, 0.2, outcomes, 0, done))
        client.start()
        try:
            assert poll_until(lambda: (daemon.status() or {}).get("in_flight", 0) >= 1, timeout=30)
            scaled = daemon.cli("scale", "pipeline=2")
            restarted = daemon.cli("restart", "pipeline/0")
            still_reading = client.is_alive()
        finally:
            done.set()
            # Before the daemon stops: stopped with the request still streaming, it drains it (up to the 60 s
            # above), and past the helper's 30 s it is killed, leaving its shared-memory directory behind.
            client.join(150)
    assert still_reading, "the request ended before the restart: this test would not see the drain"
    assert scaled.returncode == 0 and restarted.returncode == 0, scaled.stderr + restarted.stderr
    assert [outcome for outcome, _ in outcomes.values()] == ["OK"]


def test_audio_is_bit_identical_with_one_and_three_vocoder_replicas(demo):
    one = demo.cli("scale", "vocoder=1")
    assert one.returncode == 0, one.stderr
    assert [w["name"] for w in workers_of(demo.topology(), "vocoder")] == ["vocoder"]
    single, _ = synthesize(demo.listen, TEXT)
    three = demo.cli("scale", "vocoder=3")
    assert three.returncode == 0, three.stderr
    assert _concurrent(demo.listen, 3) == [single] * 3
    assert single == demo.expected


def test_the_worker_a_scale_renames_takes_its_new_name_in_its_title_and_log_lines():
    """After `scale vocoder=1` from 2, status and topology named the remaining worker `vocoder` while its process
    title stayed `sv:vocoder/0` and its log lines `[vocoder/0 pid N]`.

    1. the demo with the vocoder in 2 replicas; `scale vocoder=1`
    2. the remaining worker's /proc/PID/comm becomes `sv:vocoder`, its log lines say `[vocoder pid PID]`
    3. `scale vocoder=2`: it is `sv:vocoder/0` again
    """
    with ServeProcess(
        "--model-path", "demo", "--isolate-stage", "vocoder", "--process-replicas", "vocoder=2"
    ) as daemon:
        daemon.wait_serving(timeout=300)
        down = daemon.cli("scale", "vocoder=1", "--format", "json")
        assert down.returncode == 0, down.stderr
        ((name, pid),) = [(w["name"], w["pid"]) for w in json.loads(down.stdout)["workers"]]
        assert name == "vocoder" and [w["pid"] for w in workers_of(daemon.topology(), "vocoder")] == [pid]
        comm = Path(f"/proc/{pid}/comm")
        poll_until(lambda: comm.read_text().strip() == "sv:vocoder", timeout=30, message="the title sv:vocoder")
        poll_until(
            lambda: (
                f"[vocoder pid {pid}] stagevisor.worker: this worker is 'vocoder' now" in daemon.log_path.read_text()
            ),
            timeout=30,
            message="a log line under its new name",
        )
        up = daemon.cli("scale", "vocoder=2")
        assert up.returncode == 0, up.stderr
        poll_until(lambda: comm.read_text().strip() == "sv:vocoder/0", timeout=30, message="the title sv:vocoder/0")


MOSS_YAML = """\
model_path: OpenMOSS-Team/MOSS-TTS-v1.5
stages:
  - name: tts_engine
    runtime: {resources: {total_gpu_memory_fraction: 0.6}}
  - name: vocoder
    process: vocoder
    gpu: null
processes:
  vocoder: {replicas: 3}
"""
"""The seed model's stand-ins with the vocoder replicated on CPU; the engine's group declares 0.6 of GPU 0,
so two of it would not fit (validation is the same without a GPU)."""


def test_stand_ins_speak_identically_with_three_and_one_replicas_and_scale_respects_the_gpu_budget(tmp_path: Path):
    config = tmp_path / "moss-replicas.yaml"
    config.write_text(MOSS_YAML)
    with ServeProcess("--config", str(config), "--stand-ins") as daemon:
        daemon.wait_serving(timeout=300)
        before = daemon.topology()
        assert len(workers_of(before, "vocoder")) == 3
        replicated = _concurrent(daemon.listen, 3)
        refused = daemon.cli("scale", "pipeline=2", "--format", "json")
        assert refused.returncode == 2
        assert refused.stderr.startswith("error: GPU 0 would carry "), refused.stderr  # the code is the JSON's
        assert json.loads(refused.stdout)["error"]["code"] == "OVER_LIMIT", refused.stdout
        # Where the group's worker runs on CPU (no CUDA device), the refusal says how to plan it as a CPU group.
        on_cpu = before["groups"][0].get("device") == "cpu"
        assert ("`gpu: null` on its stages" in refused.stderr) == on_cpu, (before["groups"][0], refused.stderr)
        after = daemon.topology()  # nothing changed
        assert [g["name"] for g in after["groups"]] == ["pipeline", "vocoder"] and "replicas" not in after["groups"][0]
        assert workers_of(after, "pipeline")[0]["pid"] == workers_of(before, "pipeline")[0]["pid"]
        one = daemon.cli("scale", "vocoder=1")
        assert one.returncode == 0, one.stderr
        single, _ = synthesize(daemon.listen, TEXT)
    assert replicated == [single] * 3


def test_a_replica_that_crashes_while_it_drains_fails_what_it_held_at_once():
    """preprocessing -> pipeline (2 replicas) -> vocoder, a long request on each replica; `scale pipeline=1` stops
    pipeline/1 (at once: the daemon sent it nothing itself), which drains its request and is SIGKILLed meanwhile.
    Its request waited for the pipeline's idle timeout (120 s): the daemon reported no loss for a worker it was
    stopping, and the request's sender, told the replica was retired, forgot it when its link broke. Now it fails
    (UNAVAILABLE) once the daemon sees the worker die; the other replica's request completes.

    The readers read slowly only until the kill: the failure reaches a client after the chunks made before it, and
    read at one every 0.2 s, the 50 to 90 queued then took 10 to 18 s (more on a loaded machine), which timed the
    reader, not the daemon."""

    text = " ".join([TEXT] * 60)
    fast = threading.Event()
    with ServeProcess(
        "--model-path", "demo", "--isolate-stage", "preprocessing", "--isolate-stage", "vocoder",
        "--process-replicas", "pipeline=2", "--drain-timeout", "60",
    ) as daemon:  # fmt: skip
        daemon.wait_serving(timeout=300)
        outcomes: dict[int, tuple[str, float]] = {}
        clients = [
            threading.Thread(target=slow_reader, args=(daemon.listen, text, 0.2, outcomes, i, fast)) for i in range(2)
        ]
        for client in clients:
            client.start()
            time.sleep(0.5)  # the second request goes to the other replica (least in flight, then least recent)
        assert poll_until(lambda: (daemon.status() or {}).get("in_flight", 0) >= 2, timeout=30)
        victim = next(w for w in workers_of(daemon.topology(), "pipeline") if w["name"] == "pipeline/1")
        scale = threading.Thread(target=daemon.cli, args=("scale", "pipeline=1"))
        scale.start()
        poll_until(  # the daemon sent it nothing (the group is not the entry): stopped at once, it drains
            lambda: any(
                w["name"] == "pipeline/1" and w["state"] == "STOPPING"
                for w in workers_of(daemon.admin_topology(), "pipeline")
            ),
            timeout=60,
            interval=0.02,
            message="pipeline/1 draining",
        )
        try:
            os.kill(victim["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pytest.fail("pipeline/1 stopped before the kill: this test would not see a crash in its drain")
        killed = time.monotonic()
        fast.set()  # from here on the readers take what was queued ahead of the failure at once
        for client in clients:
            client.join(160)
        scale.join(60)
    results = sorted(outcome for outcome, _ in outcomes.values())
    assert len(results) == 2 and results[0] == "OK", outcomes
    assert results[1].startswith("UNAVAILABLE"), outcomes
    failed_after = next(at for outcome, at in outcomes.values() if outcome != "OK") - killed
    assert failed_after < 20, f"the held request failed {failed_after:.0f} s after its replica died"


def test_a_request_handed_on_before_its_sender_restarted_fails_at_once_when_its_replica_dies(tmp_path: Path):
    """entry -> talker (2 replicas) -> speaker (2 replicas); the speaker holds the request (its worker keeps it alive).
    1. the talker replica that routed it has handed on all of it; 2. a rolling restart replaces both talkers (each
    drains at once: it holds nothing); 3. the speaker replica holding the request is SIGKILLed. The request waited
    for --pipeline-idle-timeout: no live worker knew where it was, and the daemon fails a lost replica's requests
    only through their senders. Now it fails at once with UNAVAILABLE naming the speaker."""
    plan = make_plan(
        "handed-on",
        [("entry", "entry", None, None), ("talker", "talker", None, None), ("speaker", "speaker", None, None)],
        factories={
            "talker": "tests.integration.daemon_stages:make_talker",
            "speaker": "tests.integration.daemon_stages:make_holding_speaker",
        },
    )
    plan = rescale(rescale(plan, "talker", 2), "speaker", 2)
    marker = tmp_path / "holder.pid"
    idle = 30.0
    with DaemonProcess(plan, "--pipeline-idle-timeout", str(idle), env={"HOLD_MARKER": str(marker)}) as daemon:
        daemon.wait_serving()
        talkers = {w["name"]: w["pid"] for w in workers_of(daemon.topology(), "talker")}
        outcomes: dict[int, tuple[str, float]] = {}
        client = threading.Thread(target=slow_reader, args=(daemon.listen, "one two hold", 0.0, outcomes, 0))
        client.start()
        holder = int(poll_until(lambda: marker.exists() and marker.read_text(), timeout=60, message="request held"))
        restarted = daemon.cli("restart", "talker")
        assert restarted.returncode == 0, restarted.stderr
        now = {w["name"]: w["pid"] for w in workers_of(daemon.topology(), "talker")}
        assert all(now[name] != pid for name, pid in talkers.items()), (talkers, now)
        assert client.is_alive(), outcomes
        os.kill(holder, signal.SIGKILL)
        killed = time.monotonic()
        client.join(idle + 30)
    [(outcome, at)] = outcomes.values()
    assert outcome.startswith("UNAVAILABLE") and "'speaker'" in outcome and "went down" in outcome, outcome
    assert at - killed < idle / 2, f"failed {at - killed:.0f} s after its replica died: {outcome}"
