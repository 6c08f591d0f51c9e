"""Recovery time: a killed demo worker, from the end of its backoff to READY, against today's plain spawn.

Run by hand (not collected by pytest), from the repository root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_restart.py [--rounds 5]

Three daemons serve the demo model:

- `spawn`: the baseline, each worker a fresh interpreter that loads the voice
  from scratch (--worker-start spawn, STAGEVISOR_CACHE_DIR empty);
- `spawn+cache`: the same, reusing the optimized graphs the first worker saved;
- `forkserver`: the default, workers forked from the preloaded fork server,
  with that cache.

Each round SIGKILLs the `pipeline` worker of each (in rotating order) and
follows the admin API's lifecycle events: "noticed" is READY -> BACKOFF minus
the kill, "restart" is BACKOFF -> STARTING (the backoff ends, the new worker
starts) to STARTING -> READY, both as stamped by the daemon. Prints each
median with its spread (min-max) and its ratio to the baseline's in this run;
the target is a restart within 1 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import grpc  # noqa: E402

from daemon_helpers import DaemonProcess  # noqa: E402
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc  # noqa: E402
from stagevisor.supervisor.placement import build_plan  # noqa: E402

GROUP = "pipeline"
CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "spawn": (("--worker-start", "spawn"), {"STAGEVISOR_CACHE_DIR": ""}),
    "spawn+cache": (("--worker-start", "spawn"), {}),
    "forkserver": (("--worker-start", "forkserver"), {}),
}
NAMES = tuple(CONFIGS)


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
    return f"{statistics.median(samples) * 1000:7.0f} ms (spread {min(samples) * 1000:.0f}-{max(samples) * 1000:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="kills per configuration (median reported)")
    args = parser.parse_args()
    plan = build_plan("demo", None, [], [])
    daemons = {name: DaemonProcess(plan, *flags, "--max-restarts", str(args.rounds + 5), env=env)
               for name, (flags, env) in CONFIGS.items()}
    results: dict[str, dict[str, list[float]]] = {n: {"noticed": [], "restart": []} for n in NAMES}
    try:
        for daemon in daemons.values():
            daemon.start()
            daemon.wait_serving(timeout=180)  # one at a time: their first loads do not compete
        for round_ in range(args.rounds):
            shift = round_ % len(NAMES)
            for name in NAMES[shift:] + NAMES[:shift]:
                noticed, restart = kill_and_follow(daemons[name])
                results[name]["noticed"].append(noticed)
                results[name]["restart"].append(restart)
    finally:
        for daemon in daemons.values():
            daemon.__exit__(None, None, None)
    print(f"demo worker '{GROUP}', {args.rounds} SIGKILLs per configuration, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    baseline = statistics.median(results["spawn"]["restart"])
    for name in NAMES:
        restart = statistics.median(results[name]["restart"])
        print(f"{name:<12} noticed {summary(results[name]['noticed'])}")
        print(f"{name:<12} restart {summary(results[name]['restart'])}  x{restart / baseline:.2f} of spawn")
    fork = statistics.median(results["forkserver"]["restart"])
    print(f"forkserver restart median {fork:.2f} s: {'within' if fork <= 1.0 else 'OVER'} the 1 s target here and now")


if __name__ == "__main__":
    main()
