"""--standby-worker: a built standby takes over a crashed group's worker, and is replaced and stopped like one."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
import time
from collections import Counter

import grpc
import pytest

from tests.integration.daemon_helpers import DaemonProcess, alive, make_plan, poll_until, synthesize
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc

STANDBY = re.compile(r"worker 'pipeline': standby worker pid (\d+) started")


def cpu_pipeline():
    return make_plan(
        "standby",
        [("talker", "pipeline", None, None), ("speaker", "pipeline", None, None)],
        factories={
            "talker": "tests.integration.daemon_stages:make_talker",
            "speaker": "tests.integration.daemon_stages:make_speaker",
        },
    )


def standbys(daemon: DaemonProcess, count: int) -> list[int]:
    """The pids of the first `count` standby workers, once each has built its stages and waits."""

    def ready():
        log = daemon.log()
        pids = [int(pid) for pid in STANDBY.findall(log)]
        waiting = log.count("standby: stages talker, speaker built; waiting to take over")
        return pids[:count] if len(pids) >= count and waiting >= count else None

    return poll_until(ready, timeout=60, message=f"{count} standby workers built")


@pytest.mark.slow  # a daemon of its own, a crash and two standbys
def test_a_crashed_worker_is_replaced_by_its_standby_which_serves_and_is_itself_replaced():
    """
    1. the group's worker becomes READY, then its standby starts, builds its stages and waits;
    2. SIGKILL the worker: after the backoff, the standby (same pid) is the group's worker, READY
       with the standby's phases, and speech goes on through it;
    3. a new standby starts for the next crash; an operator's `restart --force` takes it in turn;
    4. at shutdown the worker and the last standby are stopped.
    """
    with DaemonProcess(cpu_pipeline(), "--standby-worker", "pipeline") as daemon:
        daemon.wait_serving()
        (standby,) = standbys(daemon, 1)
        worker = daemon.topology()["groups"][0]["pid"]
        assert standby != worker and alive(standby)
        with grpc.insecure_channel(daemon.admin_address) as channel:
            events = admin_pb2_grpc.AdminStub(channel).WatchEvents(admin_pb2.WatchEventsRequest(), timeout=60)
            events.initial_metadata()  # subscribed before the kill
            os.kill(worker, signal.SIGKILL)
            ready = next(e for e in events if e.new_state == "READY")
            events.cancel()
        assert ready.pid == standby
        assert re.fullmatch(
            r"started in [\d.]+s: standby activation [\d.]+s, serve [\d.]+s, handshake [\d.]+s", ready.reason
        ), ready.reason
        assert daemon.topology()["groups"][0]["pid"] == standby
        pcm, rate = synthesize(daemon.listen, "after the takeover", options={})
        assert rate == 16000 and len(pcm) > 0
        _, second = standbys(daemon, 2)
        assert second not in (worker, standby) and alive(second)
        # An operator's restart that stops the worker first takes the standby too.
        restarted = daemon.cli("restart", "pipeline", "--force")
        assert restarted.returncode == 0, restarted.stderr
        assert daemon.topology()["groups"][0]["pid"] == second and not alive(standby)
        _, _, third = standbys(daemon, 3)
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.wait_exit(60) == 0
        poll_until(
            lambda: not any(alive(pid) for pid in (standby, second, third)), timeout=30, message="every worker stopped"
        )
        assert "still running; sending SIGKILL" not in daemon.log()


@pytest.mark.slow  # a daemon of its own and a restart
def test_a_restart_without_a_pause_takes_the_standby_as_its_new_worker_at_the_groups_other_address():
    """
    1. the group's worker is READY and its standby built (for the worker's address);
    2. `stagevisor restart pipeline` (no --force): the standby, activated for the group's other address, is the
       new worker, READY with the standby's phases; the old worker stops; speech goes on through the standby;
    3. a new standby is built for the worker at the other address, and the next restart takes it in turn,
       moving the worker back; none is discarded as not matching the group.
    """
    with DaemonProcess(cpu_pipeline(), "--standby-worker", "pipeline") as daemon:
        daemon.wait_serving()
        (standby,) = standbys(daemon, 1)
        worker = daemon.topology()["groups"][0]["pid"]
        restarted = daemon.cli("restart", "pipeline")
        assert restarted.returncode == 0, restarted.stderr
        assert f"pid {worker} -> {standby}" in restarted.stdout
        assert daemon.topology()["groups"][0]["pid"] == standby and not alive(worker)
        pcm, rate = synthesize(daemon.listen, "after the restart", options={})
        assert rate == 16000 and len(pcm) > 0
        assert re.search(r"started in [\d.]+s: standby activation [\d.]+s, serve [\d.]+s", daemon.log())
        _, second = standbys(daemon, 2)
        restarted = daemon.cli("restart", "pipeline")
        assert restarted.returncode == 0, restarted.stderr
        assert daemon.topology()["groups"][0]["pid"] == second and not alive(standby)
        pcm, rate = synthesize(daemon.listen, "back at the first address", options={})
        assert rate == 16000 and len(pcm) > 0
        assert "no longer matches the group" not in daemon.log()


@pytest.mark.slow  # a daemon of its own, two replicas and a scale
def test_each_replica_keeps_a_standby_and_a_scale_stops_the_standbys_of_workers_it_removes():
    """Before: `--standby-worker pipeline` with two replicas was refused ("the groups are pipeline/0,
    pipeline/1"), and after a scale to one replica the standbys of `pipeline/0` and `pipeline/1` lived on, each a
    built worker, until the daemon stopped, while `pipeline` had none.
    1. each replica's standby starts and builds its stages;
    2. `stagevisor scale pipeline=1`: both are stopped (one's worker is gone, the other's is `pipeline` now),
       and `pipeline` gets its own;
    3. SIGKILL the worker: that standby takes over.
    """
    plan = cpu_pipeline()
    plan = dataclasses.replace(plan, groups=(dataclasses.replace(plan.group("pipeline"), replicas=2),))
    started = re.compile(r"worker '(pipeline(?:/\d)?)': standby worker pid (\d+) started")
    with DaemonProcess(plan, "--standby-worker", "pipeline") as daemon:
        daemon.wait_serving()

        def standbys_of(names: set[str]) -> dict[str, int] | None:
            log = daemon.log()
            found = {name: int(pid) for name, pid in started.findall(log)}
            built = log.count("standby: stages talker, speaker built; waiting to take over")
            return found if names <= set(found) and built >= len(found) else None

        first = poll_until(lambda: standbys_of({"pipeline/0", "pipeline/1"}), timeout=60, message="two standbys")
        scaled = daemon.cli("scale", "pipeline=1")
        assert scaled.returncode == 0, scaled.stderr
        own = poll_until(lambda: standbys_of({"pipeline"}), timeout=60, message="the group's standby")["pipeline"]
        poll_until(
            lambda: not any(alive(first[name]) for name in ("pipeline/0", "pipeline/1")),
            timeout=30,
            message="the replicas' standbys stopped",
        )
        assert own not in first.values() and alive(own)
        worker = daemon.admin_topology()["groups"][0]["pid"]
        os.kill(worker, signal.SIGKILL)
        poll_until(
            lambda: (
                daemon.admin_topology()["groups"][0]["pid"] == own
                and daemon.admin_topology()["groups"][0]["state"] == "READY"
            ),
            timeout=60,
            message="the standby took over",
        )


RETRY_AFTER = 0.05
"""Seconds a client waits after a failed request before its next one."""


class Load:
    """Client threads sending short requests back to back (RETRY_AFTER after a failure); each outcome with the
    time its request started."""

    def __init__(self, address: str, clients: int = 2) -> None:
        self.address = address
        self.outcomes: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                synthesize(self.address, "under load", options={})
                self.outcomes.append((started, "OK"))
            except grpc.RpcError as error:
                self.outcomes.append((started, error.code().name))
                self._stop.wait(RETRY_AFTER)

    def more(self, count: int) -> None:
        target = len(self.outcomes) + count
        poll_until(lambda: len(self.outcomes) >= target, timeout=60, message=f"{count} more requests")

    def since(self, moment: float) -> Counter:
        return Counter(code for started, code in self.outcomes if started >= moment)

    def between(self, first: float, last: float) -> Counter:
        return Counter(code for started, code in self.outcomes if first <= started < last)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
            assert not thread.is_alive(), "a client is stuck"


def worker_after(daemon: DaemonProcess, old: int) -> int:
    """The group's worker pid once a worker other than `old` is READY."""

    def ready():
        group = daemon.admin_topology()["groups"][0]
        return group["pid"] if group["state"] == "READY" and group["pid"] not in (0, old) else None

    return poll_until(ready, timeout=60, interval=0.05, message="the group READY with a new worker")


def test_standby_faults_under_load_cost_no_request_beyond_the_crashed_workers_own():
    """Under two clients sending requests back to back (retrying 50 ms after a failure):
    1. SIGKILL the standby: no request fails, the worker serves on (a standby serves nothing);
    2. SIGKILL the worker: the dead standby is not used; a new worker starts as usual, then a new standby;
    3. SIGKILL that worker: the new standby takes over (same pid);
    in 2 and 3 the only failures are UNAVAILABLE, for requests started while the group had no worker (in
    flight on the dead one, or sent before the new one was READY); every request started after is answered.
    """
    with DaemonProcess(cpu_pipeline(), "--standby-worker", "pipeline") as daemon:
        daemon.wait_serving()
        (standby,) = standbys(daemon, 1)
        worker = daemon.admin_topology()["groups"][0]["pid"]
        load = Load(daemon.listen)
        try:
            load.more(10)
            quiet_from = time.monotonic()
            os.kill(standby, signal.SIGKILL)
            load.more(40)
            assert set(load.since(quiet_from)) == {"OK"}, load.since(quiet_from)
            assert daemon.admin_topology()["groups"][0]["pid"] == worker

            crash = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            second = worker_after(daemon, worker)
            back = time.monotonic()
            assert second != standby
            poll_until(lambda: f"standby worker pid {standby} had exited" in daemon.log(), timeout=30, message="log")
            load.more(20)
            first_outage = load.between(crash, back)
            assert set(load.since(back)) == {"OK"}, load.since(back)

            _, new_standby = standbys(daemon, 2)
            takeover = time.monotonic()
            os.kill(second, signal.SIGKILL)
            assert worker_after(daemon, second) == new_standby
            taken = time.monotonic()
            load.more(20)
            second_outage = load.between(takeover, taken)
            assert set(load.since(taken)) == {"OK"}, load.since(taken)
        finally:
            load.stop()
        everything = Counter(code for _, code in load.outcomes)
        assert set(everything) <= {"OK", "UNAVAILABLE"}, everything
        print(
            f"\n{len(load.outcomes)} requests: {dict(everything)}; standby killed: 0 failed; worker killed, normal "
            f"start: {dict(first_outage)} in {back - crash:.2f} s; worker killed, standby took over: "
            f"{dict(second_outage)} in {taken - takeover:.2f} s"
        )
