"""RayWorker, the daemon's handle of a worker under a Ray actor, against a fake actor (no Ray, no processes)."""

from __future__ import annotations

import asyncio
import signal
import typing
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.cluster.actor import HostActor
from stagevisor.supervisor.cluster.host import HostHandshake, WorkerHost
from stagevisor.supervisor.cluster.launcher import actor_name
from stagevisor.supervisor.cluster.worker import RayWorker
from stagevisor.supervisor.worker.handshake import WorkerFailed, WorkerReady

NODE_ID = "ab" * 28


class RayError(Exception):
    pass


class ActorDied(RayError):
    pass


FAKE_RAY_EXCEPTIONS = SimpleNamespace(RayError=RayError)


class Method:
    def __init__(self, answer: Callable[..., Any]) -> None:
        self.answer = answer
        self.calls: list[tuple] = []

    def remote(self, *args: Any) -> Any:
        self.calls.append(args)
        future: Future = Future()
        try:
            result = self.answer(*args)
        except BaseException as error:  # noqa: BLE001 - handed to the waiter, as Ray does
            future.set_exception(error)
        else:
            if isinstance(result, Future):
                return SimpleNamespace(future=lambda: result)
            future.set_result(result)
        return SimpleNamespace(future=lambda: future)


class FakeActor:
    def __init__(self, reply: HostHandshake | None = None, *, exit_code: Any = 0, pid: Any = 4321) -> None:
        ready = HostHandshake(WorkerReady(pid=4321, fraction_enforced=False), NODE_ID, "vm")
        self.pid = Method(lambda: pid() if callable(pid) else pid)
        self.handshake = Method(lambda timeout: reply or ready)
        self.wait_exit = Method(lambda: exit_code() if callable(exit_code) else exit_code)
        self.unresponsive = Method(lambda timeout: None)
        self.signal = Method(lambda signum: None)


class FakeRay:
    exceptions = FAKE_RAY_EXCEPTIONS

    def __init__(self) -> None:
        self.killed: list[Any] = []

    def kill(self, actor: Any, no_restart: bool = True) -> None:
        self.killed.append(actor)


def worker(actor: FakeActor, ray: FakeRay | None = None, lacks: Callable[[], list[str]] = list) -> RayWorker:
    return RayWorker(
        "vocoder", actor, ray or FakeRay(), heartbeat_timeout=0.0, name="stagevisor-vm-1-vocoder-1", lacks=lacks
    )


def test_the_actor_seam_names_worker_host_methods_with_their_arguments_and_results():
    """The launcher's typed HostActor and the actor class Ray runs (WorkerHost) must not drift apart: each
    method RayWorker may call exists on WorkerHost, taking the arguments and returning the result it declares."""
    methods = {name: member for name, member in vars(HostActor).items() if isinstance(member, property)}
    assert sorted(methods) == [
        "devices",
        "handshake",
        "launch",
        "next_beat",
        "pid",
        "signal",
        "unresponsive",
        "wait_exit",
    ]
    for name, member in methods.items():
        args, result = typing.get_args(typing.get_type_hints(member.fget)["return"])
        hints = typing.get_type_hints(vars(WorkerHost)[name])
        assert (list(args), result) == ([v for k, v in hints.items() if k != "return"], hints["return"]), name


def test_ready_reports_the_worker_pid_its_host_and_ray_node():
    handshake = asyncio.run(worker(FakeActor()).handshake(5.0))
    assert handshake.pid == 4321 and handshake.host == "vm" and handshake.node_id == "ab" * 28


def test_a_stage_that_failed_to_build_is_a_start_error_naming_the_stage():
    failed = WorkerFailed("stage 'vocoder' failed to build: boom", "vocoder", "Traceback ...")
    reply = HostHandshake(failed, NODE_ID, "vm")
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(FakeActor(reply)).handshake(5.0))
    assert caught.value.stage == "vocoder" and "boom" in caught.value.message


@pytest.mark.parametrize(
    "reply, words",
    [
        (HostHandshake(None, NODE_ID, "vm", exitcode=-9), "died during initialization (killed by SIGKILL)"),
        (HostHandshake(None, NODE_ID, "vm", timed_out=True), "did not report READY within 5s"),
    ],
)
def test_a_worker_that_died_or_hung_before_ready_says_so_and_where(reply, words):
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(FakeActor(reply)).handshake(5.0))
    assert words in caught.value.message and "on node vm" in caught.value.message


def test_an_actor_ray_cannot_place_fails_at_once_with_what_the_cluster_lacks():
    pending: Future = Future()  # never scheduled: its first call never answers
    actor = FakeActor(pid=lambda: pending)
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(actor, lacks=lambda: ["no alive node has the Ray resource 'tts-b'"]).handshake(600.0))
    assert "CLUSTER_LACKS" in caught.value.message and "'tts-b'" in caught.value.message


def test_an_actor_that_dies_before_ready_names_ray_s_reason_and_what_the_cluster_lacks():
    def died():
        raise ActorDied("The actor died because its node has died.\nmore")

    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(FakeActor(pid=died), lacks=lambda: ["no alive node has 'tts-b'"]).handshake(5.0))
    assert "its node has died" in caught.value.message and "CLUSTER_LACKS" in caught.value.message
    assert "more" not in caught.value.message


def test_exit_status_comes_from_the_actor_and_a_lost_actor_is_an_unknown_status():
    assert asyncio.run(worker(FakeActor(exit_code=-15)).wait_exit()) == -15

    def gone():
        raise ActorDied("The actor is dead")

    lost = worker(FakeActor(exit_code=gone))
    assert asyncio.run(lost.wait_exit()) is None and lost.exited


def test_terminate_signals_the_worker_and_kill_ends_the_actor_too():
    actor, ray = FakeActor(), FakeRay()
    handle = worker(actor, ray)
    handle.terminate()
    assert actor.signal.calls == [(signal.SIGTERM,)] and ray.killed == []
    handle.kill()
    assert actor.signal.calls[-1] == (signal.SIGKILL,) and ray.killed == [actor]
    handle.close()
    assert ray.killed == [actor, actor]


def test_actor_names_carry_the_daemon_the_worker_and_the_start():
    assert actor_name("vm-12", "vocoder/1", 3) == "stagevisor-vm-12-vocoder/1-3"


def test_an_actor_the_busy_cluster_never_places_gives_up_at_the_start_timeout():
    pending: Future = Future()
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(FakeActor(pid=lambda: pending)).handshake(0.5))
    assert "within 0.5s" in caught.value.message and "busy" in caught.value.message


def test_a_host_counts_heartbeat_silence_from_the_watch_not_from_a_long_start():
    """A worker beats only once READY: a start longer than the timeout must not read as silence."""
    import time

    from stagevisor.supervisor.cluster.host import Heartbeats

    # No process: only the heartbeat bookkeeping, of a worker spawned 100 s ago that has not beaten since.
    heartbeats = Heartbeats(exited=lambda: False, since=time.monotonic() - 100.0)
    silence = heartbeats.unresponsive(0.05)
    assert silence is not None and 0.05 <= silence < 100.0
    heartbeats.close()
    assert heartbeats.unresponsive(0.05) is None  # the worker is gone: its exit tells the story


def test_a_host_waits_for_the_next_beat_and_says_false_once_the_worker_is_gone():
    import threading
    import time

    from stagevisor.supervisor.cluster.host import Heartbeats

    heartbeats = Heartbeats(exited=lambda: False)

    def beat() -> None:
        time.sleep(0.05)
        heartbeats.beat()

    threading.Thread(target=beat).start()
    assert heartbeats.next_beat() is True
    heartbeats.close()
    assert heartbeats.next_beat() is False


def test_a_silent_worker_is_reported_after_three_missed_beats_and_its_next_beat_is_awaited_on_its_host():
    """The silence asked of the host is three beats' worth of the timeout (10 s: 3 s); a host that says the
    worker is gone (None, False) makes neither wait return: the worker's exit tells the story."""
    actor = FakeActor()
    actor.unresponsive = Method(lambda timeout: 3.2)
    actor.next_beat = Method(lambda: True)
    ray_worker = RayWorker("vocoder", actor, FakeRay(), heartbeat_timeout=10.0, name="stagevisor-vm-1-vocoder-1")
    ray_worker.pid, ray_worker.host = 4321, "vm"

    async def scenario():
        reason = await asyncio.wait_for(ray_worker.silent(), 5)
        await asyncio.wait_for(ray_worker.beating(), 5)
        actor.unresponsive.answer, actor.next_beat.answer = (lambda timeout: None), (lambda: False)
        gone = [asyncio.ensure_future(ray_worker.silent()), asyncio.ensure_future(ray_worker.beating())]
        await asyncio.sleep(0.1)
        pending = [not task.done() for task in gone]
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        return reason, pending

    reason, pending = asyncio.run(scenario())
    assert actor.unresponsive.calls[0] == (3.0,)
    assert reason == "worker pid 4321 of group 'vocoder' on host vm sent no heartbeat for 3.2s"
    assert pending == [True, True]


class FakePlacementRay(FakeRay):
    """Records the placement groups asked for (ray.util.placement_group) and their removal."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple] = []
        self.removed: list[Any] = []
        self.util = SimpleNamespace(placement_group=self._placement_group, remove_placement_group=self.removed.append)

    def _placement_group(self, bundles, strategy, name):
        self.groups.append((bundles, strategy, name))
        return f"pg:{name}"


def tp_gang(ray: FakePlacementRay | None = None):
    from stagevisor.supervisor.plan import ProcessGroup
    from stagevisor.supervisor.cluster.tp import TpGang

    ranks = [ProcessGroup(f"engine_tp{i}", ("engine",), i, 0.4, tp_rank=i, tp_size=2, node="tts-a") for i in range(2)]
    return TpGang(ray or FakePlacementRay(), "vm-1", "engine", ranks, 0.9)


def tp_actor(visible: str, node: str = "ab" * 28) -> FakeActor:
    actor = FakeActor()
    actor.devices = Method(lambda: {"visible": visible, "node_id": node, "hostname": "vm"})
    actor.launch = Method(lambda seen: 4000 + int(visible))
    return actor


def test_a_tp_stage_asks_ray_for_one_strict_pack_placement_group_of_one_bundle_per_rank():
    ray = FakePlacementRay()
    gang = tp_gang(ray)
    [(bundles, strategy, name)] = ray.groups
    assert strategy == "STRICT_PACK" and name == "stagevisor-vm-1-engine-tp" == gang.name
    assert bundles == [{"GPU": 1.0, "tts-a": 0.001}] * 2
    gang.remove()
    assert ray.removed == ["pg:stagevisor-vm-1-engine-tp"]


def test_tp_ranks_start_their_workers_seeing_every_rank_s_gpu_in_rank_order():
    """Ray gave rank 0 GPU 3 and rank 1 GPU 1: each worker sees "3,1", its own at index tp_rank."""
    gang = tp_gang()
    actors = [tp_actor("3"), tp_actor("1")]
    workers = [
        RayWorker(f"engine_tp{r}", actors[r], FakeRay(), heartbeat_timeout=0.0, name=f"a{r}", tp=(gang, r))
        for r in range(2)
    ]

    async def both():
        return await asyncio.gather(*(w.handshake(5.0) for w in workers))

    handshakes = asyncio.run(both())
    assert [a.launch.calls for a in actors] == [[("3,1",)], [("3,1",)]]
    assert [h.pid for h in handshakes] == [4321, 4321]  # the READY reply's pid wins
    assert all(a.pid.calls == [] for a in actors)  # a deferred actor is probed with devices(), not pid()


def test_a_tp_rank_whose_peer_is_never_placed_fails_to_start_naming_the_missing_rank():
    gang = tp_gang()
    worker0 = RayWorker("engine_tp0", tp_actor("0"), FakeRay(), heartbeat_timeout=0.0, name="a0", tp=(gang, 0))
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker0.handshake(0.3))
    message = caught.value.message
    assert "waited in vain for ranks [1]" in message and "stagevisor-vm-1-engine-tp" in message


def test_a_rank_restarted_alone_joins_its_running_peer_but_not_one_on_a_lost_node():
    gang = tp_gang()

    def rank(r: int, actor: FakeActor) -> RayWorker:
        return RayWorker(f"engine_tp{r}", actor, FakeRay(), heartbeat_timeout=0.0, name=f"a{r}", tp=(gang, r))

    again = tp_actor("1")

    async def scenario():  # one event loop, as in the daemon
        await asyncio.gather(rank(0, tp_actor("0")).handshake(5.0), rank(1, tp_actor("1")).handshake(5.0))
        await rank(1, again).handshake(5.0)
        # Rank 0 restarted on another node: rank 1's entry is from the lost node, so it waits for rank 1 there.
        await rank(0, tp_actor("0", node="cd" * 28)).handshake(0.3)

    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(scenario())
    assert again.launch.calls == [("0,1",)]
    assert "ranks [1]" in caught.value.message and "cdcdcdcdcdcd" in caught.value.message
