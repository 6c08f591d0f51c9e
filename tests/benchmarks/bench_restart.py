"""Recovery time: a killed demo worker, from the end of its backoff to READY, against today's plain spawn.

Run by hand (not collected by pytest), from the repository root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_restart.py [--rounds 5]

Three daemons serve the demo model, each started as an operator does
(`python -m stagevisor serve --model-path demo`):

- `spawn`: the baseline, each worker a fresh interpreter that loads the voice
  from scratch (--worker-start spawn, STAGEVISOR_CACHE_DIR empty);
- `spawn+cache`: the same, reusing the optimized graphs the first worker saved;
- `forkserver`: the default, workers forked from the preloaded fork server,
  with that cache;
- `standby`: the same plus `--standby-worker pipeline` (opt-in): a built
  standby takes over. Before each kill the benchmark waits until the standby
  has built its stages (the daemon log says so), as it would have in a
  worker's normal life.

Each round SIGKILLs the `pipeline` worker of each (in rotating order) and
follows the admin API's lifecycle events: "noticed" is READY -> BACKOFF minus
the kill, "restart" is BACKOFF -> STARTING (the backoff ends, the new worker
starts) to STARTING -> READY, both as stamped by the daemon. The READY event's
reason splits the restart into the worker's start phases (launch, interpreter,
imports, build, serve, handshake: process_worker.startup_phases), and the worker's
log line "voice ... loaded in" splits the build further (imports of
onnxruntime and piper, graphs, each onnxruntime session). Prints each median
with its spread (min-max), per phase, and the restart's ratio to the
baseline's in this run; the target is a restart within 1 s.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import grpc  # noqa: E402
import psutil  # noqa: E402

from daemon_helpers import DaemonProcess, ServeProcess, poll_until  # noqa: E402
from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc  # noqa: E402

GROUP = "pipeline"
CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "spawn": (("--worker-start", "spawn"), {"STAGEVISOR_CACHE_DIR": ""}),
    "spawn+cache": (("--worker-start", "spawn"), {}),
    "forkserver": (("--worker-start", "forkserver"), {}),
    "standby": (("--worker-start", "forkserver", "--standby-worker", GROUP), {}),
}
STANDBY_WAITING = "waiting to take over"
"""What a standby worker logs once built (supervisor/worker/main.py)."""
STANDBY_STARTED = re.compile(r"standby worker pid (\d+) started")


def standby_memory(daemon: DaemonProcess) -> str:
    """The memory of the daemon's current standby worker: resident, and unique to it (not shared with the fork
    server or the group's worker)."""
    pids = STANDBY_STARTED.findall(daemon.log())
    poll_until(
        lambda: daemon.log().count(STANDBY_WAITING) >= len(pids),
        timeout=120,
        interval=0.1,
        message="the last standby worker built",
    )
    info = psutil.Process(int(pids[-1])).memory_full_info()
    return (
        f"standby worker memory: RSS {info.rss / 2**20:.0f} MiB, of which unique to it (USS) {info.uss / 2**20:.0f} MiB"
    )


NAMES = tuple(CONFIGS)


PHASES = re.compile(r"(?:started|loaded) in \d+\.\d+s: (.*)")
PHASE = re.compile(r"([a-z][a-z ]*?) (\d+\.\d+)s")


def phases(text: str) -> dict[str, float]:
    """`... started in 0.5s: name 0.123s, other 0.456s` -> {name: 0.123, other: 0.456}; {} without that form."""
    match = PHASES.search(text)
    return {name: float(seconds) for name, seconds in PHASE.findall(match.group(1))} if match else {}


def kill_and_follow(daemon: DaemonProcess, standbys: int = 0, timeout: float = 120.0) -> dict[str, float]:
    """SIGKILL the group's worker; return the seconds until the daemon noticed, to READY and per phase.

    `standbys`: wait first until that many standby workers have been built.
    """
    if standbys:
        poll_until(
            lambda: daemon.log().count(STANDBY_WAITING) >= standbys,
            timeout=timeout,
            interval=0.1,
            message=f"standby worker {standbys} built",
        )
    log_from = len(daemon.log())
    with grpc.insecure_channel(daemon.admin_address) as channel:
        stream = admin_pb2_grpc.AdminStub(channel).WatchEvents(admin_pb2.WatchEventsRequest(), timeout=timeout)
        stream.initial_metadata()  # subscribed: no event after this point is missed
        pid = next(g["pid"] for g in daemon.topology()["groups"] if g["name"] == GROUP)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        stamps: dict[tuple[str, str], float] = {}
        ready_reason = ""
        for event in stream:
            if event.group != GROUP:
                continue
            stamps[(event.old_state, event.new_state)] = event.time
            if (event.old_state, event.new_state) == ("STARTING", "READY"):
                ready_reason = event.reason
                break
            if event.new_state == "FAILED":
                raise SystemExit(f"group {GROUP} FAILED: {event.reason}\n{daemon.log()}")
        stream.cancel()
    sample = {
        "noticed": stamps[("READY", "BACKOFF")] - killed,
        "restart": stamps[("STARTING", "READY")] - stamps[("BACKOFF", "STARTING")],
    }
    sample.update(phases(ready_reason))
    if not standbys:  # a standby loaded its voice long before; the line now is the next standby's
        voice_line = next((line for line in daemon.log()[log_from:].splitlines() if " loaded in " in line), "")
        sample.update({f"  voice {name}": seconds for name, seconds in phases(voice_line).items()})
    return sample


def summary(samples: list[float] | None) -> str:
    """`median (min-max)` in ms; `-` when the configuration has no such phase."""
    if not samples:
        return "-"
    return f"{statistics.median(samples) * 1000:.0f} ({min(samples) * 1000:.0f}-{max(samples) * 1000:.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="kills per configuration (median reported)")
    parser.add_argument(
        "--configs",
        default=",".join(NAMES),
        help=f"comma-separated subset of {', '.join(NAMES)} (the ratio needs spawn)",
    )
    args = parser.parse_args()
    names = tuple(name for name in NAMES if name in args.configs.split(","))
    daemons = {
        name: ServeProcess("--model-path", "demo", *flags, "--max-restarts", str(args.rounds + 5), env=env)
        for name, (flags, env) in CONFIGS.items()
        if name in names
    }
    results: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    try:
        for daemon in daemons.values():
            daemon.start()
            daemon.wait_serving(timeout=180)  # one at a time: their first loads do not compete
        load_before = os.getloadavg()[0]
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                standbys = round_ + 1 if name == "standby" else 0
                for key, seconds in kill_and_follow(daemons[name], standbys).items():
                    results[name].setdefault(key, []).append(seconds)
        memory = standby_memory(daemons["standby"]) if "standby" in daemons else ""
    finally:
        for daemon in daemons.values():
            daemon.__exit__(None, None, None)
    print(
        f"demo worker '{GROUP}', {args.rounds} SIGKILLs per configuration, {os.cpu_count()} CPUs, "
        f"1-minute load average {load_before:.1f} before the kills, {os.getloadavg()[0]:.1f} after"
    )
    keys = dict.fromkeys(k for name in names for k in results[name])
    rows = [key for key in keys if key not in ("noticed", "restart")]
    print(f"{'median ms (spread)':<22}" + "".join(f"{name:>28}" for name in names))
    for key in ("noticed", *rows, "restart"):
        label = "READY after backoff" if key == "restart" else key
        print(f"{label:<22}" + "".join(f"{summary(results[name].get(key)):>28}" for name in names))
    if "spawn" in names:
        baseline = statistics.median(results["spawn"]["restart"])
        print(
            f"{'ratio to spawn':<22}"
            + "".join(f"{'x%.3f' % (statistics.median(results[name]['restart']) / baseline):>28}" for name in names)
        )
    if memory:
        print(memory)
    for name in names:
        if name.startswith("spawn"):
            continue
        ready = statistics.median(results[name]["restart"])
        print(
            f"{name}: READY {ready:.3f} s after the backoff (median): "
            f"{'within' if ready <= 1.0 else 'OVER'} the 1 s target at this load"
        )


if __name__ == "__main__":
    main()
