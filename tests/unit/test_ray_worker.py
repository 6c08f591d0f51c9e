"""RayWorker, the daemon's handle of a worker under a Ray actor, against a fake actor (no Ray, no processes)."""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.ray_launcher import RayWorker, actor_name


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
    def __init__(self, reply: dict | None = None, *, exit_code: Any = 0, pid: Any = 4321) -> None:
        node = {"hostname": "vm", "node_id": "ab" * 28}
        self.pid = Method(lambda: pid() if callable(pid) else pid)
        self.handshake = Method(lambda timeout: {**node, **(reply or {"status": "READY", "pid": 4321})})
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
    return RayWorker("vocoder", actor, ray or FakeRay(), heartbeat_timeout=0.0, name="stagevisor-vm-1-vocoder-1",
                     lacks=lacks)


def test_ready_reports_the_worker_pid_its_host_and_ray_node():
    handshake = asyncio.run(worker(FakeActor()).handshake(5.0))
    assert handshake.pid == 4321 and handshake.host == "vm" and handshake.node_id == "ab" * 28


def test_a_stage_that_failed_to_build_is_a_start_error_naming_the_stage():
    reply = {"status": "FAILED", "stage": "vocoder", "message": "stage 'vocoder' failed to build: boom",
             "traceback": "Traceback ..."}
    with pytest.raises(WorkerStartError) as caught:
        asyncio.run(worker(FakeActor(reply)).handshake(5.0))
    assert caught.value.stage == "vocoder" and "boom" in caught.value.message


@pytest.mark.parametrize("reply, words", [
    ({"status": "DIED", "exitcode": -9}, "died during initialization (killed by SIGKILL)"),
    ({"status": "TIMEOUT"}, "did not report READY within 5s"),
])
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
    assert asyncio.run(lost.wait_exit()) is None and lost.exitcode() is None


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
    import threading
    import time

    from stagevisor.supervisor.ray_host import WorkerHost

    host = object.__new__(WorkerHost)  # no process: only the heartbeat bookkeeping
    host._beat_lock = threading.Condition()
    host._last_beat = time.monotonic() - 100.0  # spawned 100 s ago, no beat since
    host._lifeline_closed = False
    host._process = SimpleNamespace(poll=lambda: None)
    silence = host.unresponsive(0.05)
    assert 0.05 <= silence < 100.0
    host._lifeline_closed = True
    assert host.unresponsive(0.05) is None  # the worker is gone: its exit tells the story
