"""Recovery time: a killed demo worker, from the end of its backoff to READY, forkserver against spawn.

Run by hand (not collected by pytest), from the repository root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_restart.py [--rounds 5]

Two daemons serve the demo model, one per worker start method. Each round
SIGKILLs the `pipeline` worker of each (in alternating order) and follows the
admin API's lifecycle events: "noticed" is READY -> BACKOFF minus the kill,
"restart" is BACKOFF -> STARTING (the backoff ends, the new worker starts)
to STARTING -> READY, both as stamped by the daemon. Prints each method's
median with its spread (min-max) and the forkserver/spawn ratio of this run;
the target is a restart within 1 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import grpc  # noqa: E402

from daemon_helpers import DaemonProcess  # noqa: E402
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc  # noqa: E402
from stagevisor.supervisor.placement import build_plan  # noqa: E402

METHODS = ("spawn", "forkserver")
GROUP = "pipeline"


def kill_and_follow(daemon: DaemonProcess, timeout: float = 120.0) -> tuple[float, float]:
    """SIGKILL the group's worker; return (seconds until the daemon noticed, backoff end -> READY)."""
    with grpc.insecure_channel(daemon.admin_address) as channel:
        stream = admin_pb2_grpc.AdminStub(channel).WatchEvents(admin_pb2.WatchEventsRequest(), timeout=timeout)
        stream.initial_metadata()  # subscribed: no event after this point is missed
        pid = next(g["pid"] for g in daemon.topology()["groups"] if g["name"] == GROUP)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        stamps: dict[tuple[str, str], float] = {}
        for event in stream:
            if event.group != GROUP:
                continue
            stamps[(event.old_state, event.new_state)] = event.time
            if (event.old_state, event.new_state) == ("STARTING", "READY"):
                break
            if event.new_state == "FAILED":
                raise SystemExit(f"group {GROUP} FAILED: {event.reason}\n{daemon.log()}")
        stream.cancel()
    noticed = stamps[("READY", "BACKOFF")] - killed
    restart = stamps[("STARTING", "READY")] - stamps[("BACKOFF", "STARTING")]
    return noticed, restart


def summary(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:8.0f} ms  (spread {min(samples) * 1000:.0f}-{max(samples) * 1000:.0f} ms)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="kills per method (median reported)")
    args = parser.parse_args()
    plan = build_plan("demo", None, [], [])
    daemons = {method: DaemonProcess(plan, "--worker-start", method, "--max-restarts", str(args.rounds + 5))
               for method in METHODS}
    results: dict[str, dict[str, list[float]]] = {m: {"noticed": [], "restart": []} for m in METHODS}
    try:
        for daemon in daemons.values():
            daemon.start()
        for daemon in daemons.values():
            daemon.wait_serving(timeout=180)
        for round_ in range(args.rounds):
            order = METHODS if round_ % 2 == 0 else METHODS[::-1]
            for method in order:
                noticed, restart = kill_and_follow(daemons[method])
                results[method]["noticed"].append(noticed)
                results[method]["restart"].append(restart)
    finally:
        for daemon in daemons.values():
            daemon.__exit__(None, None, None)
    print(f"demo worker '{GROUP}', {args.rounds} SIGKILLs per method, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    for method in METHODS:
        print(f"{method:<11} noticed   {summary(results[method]['noticed'])}")
        print(f"{method:<11} restart   {summary(results[method]['restart'])}")
    spawn = statistics.median(results["spawn"]["restart"])
    fork = statistics.median(results["forkserver"]["restart"])
    print(f"restart ratio forkserver/spawn: {fork / spawn:.2f}  "
          f"(forkserver median {fork:.2f} s: {'within' if fork <= 1.0 else 'OVER'} the 1 s target)")


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
