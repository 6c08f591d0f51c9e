"""`--launcher ray` on a local two-node Ray cluster: placement, the synthesize path, failures, nothing left behind.

One cluster for the module (tests/integration/ray_cluster.py); each test starts its own daemon on it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

pytest.importorskip("ray", reason="the `ray` extra is not installed")

import grpc  # noqa: E402

from tests.integration.daemon_helpers import (  # noqa: E402
    ROOT,
    DaemonProcess,
    ServeProcess,
    alive,
    make_plan,
    plan_part,
    poll_until,
    synthesize,
)
from stagevisor.supervisor.plan import GpuBudget, ProcessGroup  # noqa: E402
from tests.integration.ray_cluster import NODE_A, NODE_B, SPARE, local_cluster  # noqa: E402

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: minutes of daemons under load
pytestmark = pytest.mark.slow

BLOB_SOURCE = "tests.integration.daemon_stages:make_blob_source"
BLOB_SINK = "tests.integration.daemon_stages:make_blob_sink"
TALKER = "tests.integration.daemon_stages:make_talker"
SPEAKER = "tests.integration.daemon_stages:make_speaker"
TEXT = "Hello from two Ray nodes."
RAY_START = 300.0
"""Seconds a daemon under --launcher ray may take to be SERVING: each worker waits for a fresh Ray worker
process and its own interpreter, which on a loaded 2-core machine took up to two minutes for three groups."""


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster()


def actor_prefix(daemon_pid: int) -> str:
    return f"stagevisor-{socket.gethostname().split('.')[0]}-{daemon_pid}-"


def pinned_config(tmp_path, nodes: dict[str, str]) -> str:
    path = tmp_path / "nodes.yaml"
    path.write_text("processes:\n" + "".join(f"  {group}:\n    node: {node}\n" for group, node in nodes.items()))
    return str(path)


def talk_plan(talker_node: str, speaker_node: str):
    plan = make_plan(
        "talk",
        [("talker", "talker", None, None), ("speaker", "speaker", None, None)],
        factories={"talker": TALKER, "speaker": SPEAKER},
    )
    nodes = {"talker": talker_node, "speaker": speaker_node}
    return replace(plan, groups=tuple(replace(g, node=nodes[g.name]) for g in plan.groups))


def blob_plan(source_node: str, sink_node: str):
    plan = make_plan(
        "blob",
        [("blob_source", "source", None, None), ("blob_sink", "sink", None, None)],
        factories={"blob_source": BLOB_SOURCE, "blob_sink": BLOB_SINK},
    )
    nodes = {"source": source_node, "sink": sink_node}
    return replace(plan, groups=tuple(replace(g, node=nodes[g.name]) for g in plan.groups))


def long_request(address: str, words: int, started: threading.Event, outcome: list) -> None:
    """A Synthesize call that streams for seconds; sets `started` at its first chunk, appends its end."""
    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            for _chunk in stub.Synthesize(
                synthesis_pb2.SynthesizeRequest(text=" ".join(["word"] * words)), timeout=120
            ):
                started.set()
        outcome.append("completed")
    except grpc.RpcError as error:
        outcome.append(error.code())
    finally:
        started.set()


class Load:
    """Several concurrent streaming requests plus a trickle of short ones, on their own threads.

    Every request ends on its own (completes, or fails with a status): `finish` joins them within a bound
    and reports each outcome; a thread still running then is a request that hangs.
    """

    OK = ("completed", grpc.StatusCode.UNAVAILABLE)

    def __init__(self, address: str, streams: int = 4, words: int = 900) -> None:
        self.address = address
        self.outcomes: list = []
        self.trickled: list = []
        self._stop = threading.Event()
        self._started = [threading.Event() for _ in range(streams)]
        self._threads = [
            threading.Thread(target=long_request, args=(address, words, event, self.outcomes), daemon=True)
            for event in self._started
        ]
        self._threads.append(threading.Thread(target=self._trickle, daemon=True))

    def start(self) -> "Load":
        for thread in self._threads:
            thread.start()
        assert all(event.wait(90) for event in self._started), "the streaming requests did not start"
        return self

    def _trickle(self) -> None:
        while not self._stop.is_set():
            long_request(self.address, 3, threading.Event(), self.trickled)
            self._stop.wait(0.2)

    def finish(self, timeout: float = 90.0) -> list:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = sum(thread.is_alive() for thread in self._threads)
        assert not hung, f"{hung} request thread(s) still waiting after {timeout:g}s: a request hangs"
        outcomes = self.outcomes + self.trickled
        assert all(o in self.OK for o in outcomes), f"not completed nor UNAVAILABLE: {outcomes}"
        return outcomes


def group(topology: dict, name: str) -> dict:
    return next(g for g in topology["groups"] if g["name"] == name)


def test_plan_refuses_a_node_the_cluster_lacks_before_anything_starts(cluster, tmp_path):
    config = pinned_config(tmp_path, {"vocoder": "sv-no-such-node"})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "plan",
            "--isolate-stage",
            "vocoder",
            "--config",
            config,
            "--launcher",
            "ray",
            "--ray-address",
            cluster.address,
            "--format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert error["code"] == "CLUSTER_LACKS" and "'sv-no-such-node'" in error["message"], error
    assert "'vocoder'" in error["message"]
    assert cluster.stagevisor_actors() == []
    ok = pinned_config(tmp_path, {"pipeline": NODE_A, "vocoder": NODE_B})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "plan",
            "--isolate-stage",
            "vocoder",
            "--config",
            ok,
            "--launcher",
            "ray",
            "--ray-address",
            cluster.address,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def plan_args(placement: list[str]) -> list[str]:
    """A serve placement as `plan` takes it: planning loads nothing, so it has no --stand-ins."""
    return [arg for arg in placement if arg != "--stand-ins"]


@pytest.mark.slow  # two daemons: the local launcher's reference, then the one on the cluster
@pytest.mark.parametrize(
    "placement",
    [
        ["--isolate-stage", "vocoder"],
        # A seed model's stand-ins: `pipeline` (0.85 of a GPU) and `vocoder` (0.1) ask Ray for those shares of
        # the nodes' logical GPUs and run on CPU here, as they do under the local launcher without CUDA.
        pytest.param(
            ["--model-path", "fishaudio/s2-pro", "--isolate-stage", "vocoder", "--stand-ins"], marks=pytest.mark.slow
        ),
    ],
    ids=["demo", "fishaudio-s2-pro"],
)
def test_a_model_on_two_pinned_nodes_speaks_as_under_the_local_launcher_and_stop_leaves_no_actor(
    cluster, tmp_path, placement
):
    """Steps: the model, vocoder in its own process, served locally, then under --launcher ray with
    `pipeline` pinned to one node and `vocoder` to the other; the same text both ways."""
    with ServeProcess(*placement) as local:
        local.wait_serving()
        expected, rate = synthesize(local.listen, TEXT)
    config = pinned_config(tmp_path, {"pipeline": NODE_A, "vocoder": NODE_B})
    with ServeProcess(*placement, "--config", config, "--launcher", "ray", "--ray-address", cluster.address) as daemon:
        daemon.wait_serving(timeout=RAY_START)
        audio, ray_rate = synthesize(daemon.listen, TEXT)
        assert (audio, ray_rate) == (expected, rate)  # bit-identical
        topology = daemon.topology()
        nodes = cluster.node_ids()
        assert group(topology, "pipeline")["node_id"] == nodes[NODE_A]
        assert group(topology, "vocoder")["node_id"] == nodes[NODE_B]
        assert {group(topology, "pipeline")["node"], group(topology, "vocoder")["node"]} == {NODE_A, NODE_B}
        assert all(g["host"] == socket.gethostname() and alive(g["pid"]) for g in topology["groups"])
        planned = subprocess.run(
            [sys.executable, "-m", "stagevisor", "plan", *plan_args(placement), "--config", config, "--format", "json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert plan_part(topology) == json.loads(planned.stdout), planned.stderr
        # An edge between groups on two Ray nodes goes over TCP (the demo's latents and the stand-ins' inline
        # pieces), never the daemon's shared memory; one between groups on one node (an unpinned group may land
        # beside a pinned one) stays on its unix socket.
        node_of = {stage: g["node_id"] for g in topology["groups"] for stage in g["stages"]}
        crossing = [e for e in topology["edges"] if e["cross_process"]]
        remote = [e for e in crossing if node_of[e["src"]] != node_of[e["dst"]]]
        assert remote and all(e["transport"] == "grpc_tcp" and e["requests"] == {"grpc_tcp": 1} for e in remote), (
            crossing
        )
        assert all(e["transport"] == "grpc" for e in crossing if e not in remote), crossing
        text = daemon.cli("topology").stdout
        assert f"(pinned: {NODE_B})" in text and nodes[NODE_B][:12] in text, text
        prefix = actor_prefix(daemon.pid)
        assert len(cluster.stagevisor_actors(prefix)) == len(topology["groups"])
        pids = [g["pid"] for g in topology["groups"]]
        result = daemon.cli("stop")
        assert result.returncode == 0, result.stderr
        assert daemon.wait_exit(timeout=60) == 0, daemon.log()
    poll_until(lambda: cluster.stagevisor_actors(prefix) == [], timeout=30, message="no stagevisor actor")
    poll_until(lambda: not any(alive(pid) for pid in pids), timeout=30, message="workers gone")


@pytest.mark.slow  # a daemon on the cluster; the in-process TCP, token and TLS tests are in test_dataplane_tcp.py
def test_large_payloads_cross_to_another_node_inline_over_mutual_tls_never_by_shared_memory(cluster):
    """Steps: the source on the daemon's node (which has the daemon's shared memory), the sink on the other;
    TLS between nodes forced on; a 1 MiB tensor and 1 MiB of bytes go from one to the other. A shared-memory
    reference would fail the request (the far worker maps nothing); the sink checks every byte."""
    size = str(1024 * 1024)
    with DaemonProcess(
        blob_plan(NODE_A, NODE_B),
        "--launcher",
        "ray",
        "--ray-address",
        cluster.address,
        env={"STAGEVISOR_DATAPLANE_TLS": "1"},
    ) as daemon:
        daemon.wait_serving(timeout=RAY_START)
        for _ in range(2):  # the second reuses the links
            pcm, rate = synthesize(daemon.listen, "blob", {"size": size})
            assert rate == 256 and pcm == b"\xff\x3f" * 8, pcm  # 8 samples at level 0.5 (16383): intact
        topology = daemon.topology()
        crossing = [e for e in topology["edges"] if e["cross_process"]]
        assert crossing and all(e["transport"] == "grpc_tcp" and e["requests"] == {"grpc_tcp": 2} for e in crossing), (
            crossing
        )
        nodes = cluster.node_ids()
        assert [group(topology, g)["node_id"] for g in ("source", "sink")] == [nodes[NODE_A], nodes[NODE_B]]
        assert "the data plane crosses nodes over TCP (mutual TLS, bearer token)" in daemon.log()


def test_a_killed_actor_under_load_fails_its_requests_unavailable_and_comes_back_and_a_sigkilled_daemon_leaves_none(
    cluster,
):
    """Steps: talker on one node, speaker on the other; four long requests stream and short ones trickle in;
    the speaker's actor is killed (ray.kill); every streaming request ends UNAVAILABLE within a bound, every
    trickled one completes or fails UNAVAILABLE, none hangs; the group restarts on its node and new requests
    complete; then the daemon is SIGKILLed and Ray ends its actors and their workers."""
    with DaemonProcess(
        talk_plan(NODE_A, NODE_B), "--launcher", "ray", "--ray-address", cluster.address, "--backoff-initial", "0.1"
    ) as daemon:
        daemon.wait_serving(timeout=RAY_START)
        prefix = actor_prefix(daemon.pid)
        before = group(daemon.topology(), "speaker")
        load = Load(daemon.listen).start()
        [name] = [n for n in cluster.stagevisor_actors(prefix) if n.startswith(f"{prefix}speaker-")]
        cluster.ray.kill(cluster.ray.get_actor(name, namespace="stagevisor"), no_restart=True)

        def restarted():
            now = group(daemon.topology(), "speaker")
            return now if now["state"] == "READY" and now["restarts"] == 1 else None

        after = poll_until(restarted, timeout=90, message="speaker READY again")
        load.finish()
        assert load.outcomes == [grpc.StatusCode.UNAVAILABLE] * 4, load.outcomes
        assert after["pid"] != before["pid"] and not alive(before["pid"])
        assert after["node_id"] == cluster.node_ids()[NODE_B]
        done: list = []
        long_request(daemon.listen, 3, threading.Event(), done)
        assert done == ["completed"]
        pids = [g["pid"] for g in daemon.topology()["groups"]]
        assert len(cluster.stagevisor_actors(prefix)) == 2
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait_exit(timeout=30)
        poll_until(lambda: cluster.stagevisor_actors(prefix) == [], timeout=60, message="actors gone")
        poll_until(lambda: not any(alive(pid) for pid in pids), timeout=30, message="workers gone")
    from stagevisor.supervisor.dataplane import shm

    shm.remove_orphan_areas(shm.shm_root())  # the killed daemon's, as its next start on this host would


def tp_plan(node: str):
    """talker as a tensor-parallel stage of two ranks (placement GPUs 2 and 3, 0.4 each) pinned to `node`;
    speaker on CPU, two replicas, unpinned. The nodes' GPUs are 0 and 1: a worker that sees 2 or 3 was not
    given Ray's."""
    plan = talk_plan(node, NODE_A)
    talker, speaker = plan.stages
    talker = replace(talker, gpu=(2, 3), tp_size=2, total_gpu_memory_fraction=0.4, fraction_source="declared")
    ranks = tuple(
        ProcessGroup(f"talker_tp{r}", ("talker",), 2 + r, 0.4, tp_rank=r, tp_size=2, node=node) for r in range(2)
    )
    budgets = tuple(GpuBudget(2 + r, 0.4, 0.9, (f"talker_tp{r}",)) for r in range(2))
    replicas = replace(plan.group("speaker"), replicas=2, node=None)
    return replace(plan, stages=(talker, speaker), groups=(*ranks, replicas), gpus=budgets)


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        entries = handle.read().split(b"\0")
    return dict(entry.decode().split("=", 1) for entry in entries if b"=" in entry)


TP_NODES = ("sv-tp-d", "sv-tp-e")
TP_PIN = "sv-tp"
"""Two nodes this test adds, each with two logical GPUs and the resource the TP stage is pinned to."""


@pytest.mark.slow  # two more nodes, four actors, two of them in a placement group
@pytest.mark.soak
def test_tp_ranks_stay_together_on_a_node_see_every_rank_s_gpu_and_move_together_when_it_goes(cluster):
    """Steps: a TP stage of two ranks pinned to a resource two 2-GPU nodes hold, and a CPU stage of two
    replicas; the replicas spread over two nodes and `topology` and `status` say where each runs; both ranks
    land in one STRICT_PACK placement group on one node, each worker sees both GPUs Ray gave the ranks, in
    rank order; under load, that node is removed: the requests fail UNAVAILABLE, none hangs, the placement
    group and both ranks come back together on the other node; that one is removed too: the ranks end FAILED
    saying what the cluster lacks; after stop no actor and no placement group remain."""
    for name in TP_NODES:
        cluster.add_node(name, {name: 1, TP_PIN: 1}, gpus=2)
    with DaemonProcess(
        tp_plan(TP_PIN),
        "--launcher",
        "ray",
        "--ray-address",
        cluster.address,
        "--backoff-initial",
        "0.5",
        "--backoff-max",
        "1",
        "--max-restarts",
        "8",
    ) as daemon:
        daemon.wait_serving(timeout=RAY_START)
        prefix = actor_prefix(daemon.pid)
        holder = {cluster.node_ids()[name]: name for name in TP_NODES}
        # Replicas: each with its host and Ray node in topology and status. Ray's SPREAD is best effort (on a
        # loaded machine both may land on one node), so where they land is not asserted, only that it is shown.
        workers = group(daemon.topology(), "speaker")["workers"]
        assert [w["name"] for w in workers] == ["speaker/0", "speaker/1"]
        assert all(w["state"] == "READY" and w["host"] == socket.gethostname() for w in workers), workers
        alive = {entry["NodeID"] for entry in cluster.ray.nodes() if entry.get("Alive")}
        assert all(w["node_id"] in alive for w in workers), workers
        status = {g["name"]: g for g in daemon.status()["groups"]}
        assert [status[w["name"]]["node_id"] for w in workers] == [w["node_id"] for w in workers]
        text = daemon.cli("topology").stdout
        line = next(line for line in text.splitlines() if line.lstrip().startswith("speaker/1"))
        assert workers[1]["node_id"][:12] in line and socket.gethostname() in line, text

        def placed() -> tuple[str, dict]:
            """The node both ranks run on (asserting they share it and its placement group), and the group."""
            ranks = [group(daemon.topology(), f"talker_tp{r}") for r in range(2)]
            [node_id] = {g["node_id"] for g in ranks}
            [placement] = [
                pg
                for pg in cluster.ray.util.placement_group_table().values()
                if pg["name"].startswith(prefix) and pg["state"] == "CREATED"
            ]
            assert placement["name"] == f"{prefix}talker-tp" and placement["strategy"] == "STRICT_PACK"
            assert len(placement["bundles"]) == 2 and set(placement["bundles_to_node_id"].values()) == {node_id}
            # Ray gave each rank's actor one GPU of the node (0 or 1); each worker sees both, in rank order.
            names = cluster.stagevisor_actors(prefix)
            actors = [
                cluster.ray.get_actor(
                    max(
                        (n for n in names if n.startswith(f"{prefix}talker_tp{r}-")),
                        key=lambda n: int(n.rsplit("-", 1)[1]),
                    ),
                    namespace="stagevisor",
                )
                for r in range(2)
            ]
            given = [cluster.ray.get(actor.devices.remote(), timeout=60)["visible"] for actor in actors]
            assert sorted(given) == ["0", "1"], given
            assert [environ(g["pid"])["CUDA_VISIBLE_DEVICES"] for g in ranks] == [",".join(given)] * 2
            return node_id, placement

        first, _ = placed()
        done: list = []
        long_request(daemon.listen, 3, threading.Event(), done)
        assert done == ["completed"]
        load = Load(daemon.listen, streams=2).start()
        cluster.remove_node(holder[first])

        def both_ready_elsewhere():
            ranks = [group(daemon.topology(), f"talker_tp{r}") for r in range(2)]
            return all(g["state"] == "READY" and g["node_id"] not in ("", first) for g in ranks)

        poll_until(both_ready_elsewhere, timeout=120, message="both ranks READY on the other node")
        load.finish()
        assert load.outcomes == [grpc.StatusCode.UNAVAILABLE] * 2, load.outcomes
        second, _ = placed()
        assert holder[second] != holder[first]
        done = []
        long_request(daemon.listen, 3, threading.Event(), done)
        assert done == ["completed"]
        cluster.remove_node(holder[second])
        poll_until(
            lambda: group(daemon.topology(), "talker_tp0")["state"] == "FAILED", timeout=120, message="rank 0 FAILED"
        )
        failures = [line for line in daemon.log().splitlines() if "'talker_tp" in line and "CLUSTER_LACKS" in line]
        assert any("needs 2 whole GPUs on one node" in line and f"'{TP_PIN}'" in line for line in failures), (
            daemon.log()[-3000:]
        )
        result = daemon.cli("stop")
        assert result.returncode == 0, result.stderr
        assert daemon.wait_exit(timeout=60) == 0, daemon.log()

    def removed():
        return all(
            pg["state"] == "REMOVED"
            for pg in cluster.ray.util.placement_group_table().values()
            if pg["name"].startswith(prefix)
        )

    poll_until(lambda: cluster.stagevisor_actors(prefix) == [], timeout=30, message="no stagevisor actor")
    poll_until(removed, timeout=30, message="the placement group removed")


@pytest.mark.slow
@pytest.mark.soak
def test_a_lost_node_under_load_moves_its_group_to_another_that_fits_and_fails_it_when_none_does(cluster):
    """Steps: the speaker is pinned to a resource two nodes hold; under load (streaming and trickled
    requests), the node it runs on is removed: the requests on it fail UNAVAILABLE, none hangs, and the
    group comes back on the other node; that one is removed too (again under load); the group ends FAILED
    saying what the cluster lacks. Runs last: it takes the module's second node away."""
    cluster.add_node("sv-node-c", {"sv-node-c": 1, SPARE: 1})
    with DaemonProcess(
        talk_plan(NODE_A, SPARE),
        "--launcher",
        "ray",
        "--ray-address",
        cluster.address,
        "--backoff-initial",
        "0.5",
        "--backoff-max",
        "1",
        "--max-restarts",
        "8",
    ) as daemon:
        daemon.wait_serving(timeout=RAY_START)
        first = group(daemon.topology(), "speaker")
        holder = {node_id: name for name, node_id in cluster.node_ids().items() if name != SPARE}
        lost = holder[first["node_id"]]
        assert lost in (NODE_B, "sv-node-c")
        load = Load(daemon.listen).start()
        cluster.remove_node(lost)

        def moved():
            now = group(daemon.topology(), "speaker")
            return now if now["state"] == "READY" and now["node_id"] not in ("", first["node_id"]) else None

        second = poll_until(moved, timeout=120, message="speaker READY on another node")
        load.finish()
        assert load.outcomes == [grpc.StatusCode.UNAVAILABLE] * 4, load.outcomes
        done: list = []
        long_request(daemon.listen, 3, threading.Event(), done)
        assert done == ["completed"]
        load = Load(daemon.listen, streams=2).start()
        cluster.remove_node(holder[second["node_id"]])
        poll_until(
            lambda: group(daemon.topology(), "speaker")["state"] == "FAILED", timeout=120, message="speaker FAILED"
        )
        load.finish()
        assert load.outcomes == [grpc.StatusCode.UNAVAILABLE] * 2, load.outcomes
        refused: list = []
        long_request(daemon.listen, 3, threading.Event(), refused)
        assert refused == [grpc.StatusCode.UNAVAILABLE]
        status = daemon.status()
        assert status["state"] == "DEGRADED"
        # Restarts in the second or two before Ray declares the node dead may land on it and die there;
        # once it is declared dead, each restart fails at once saying what the cluster lacks.
        failures = [line for line in daemon.log().splitlines() if "'speaker'" in line and "stagevisor.daemon" in line]
        assert any("CLUSTER_LACKS" in line and f"'{SPARE}'" in line for line in failures), "\n".join(failures)
