"""Daemon start -> READY and READY -> clean stop, per number of process groups (1..4).

Run by hand (not collected by pytest), from the repository root, with stagevisor
installed (`pip install -e '.[test]'`); it reuses the integration tests' daemon
helpers, hence `-m` from the root:

    python -m tests.benchmarks.bench_daemon [--repeat 3]

Each figure is the median of --repeat runs, printed next to a baseline
measured in the same run: starting a bare Python interpreter (`python -c pass`)
to exit. READY is observed as the admin health service turning SERVING.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.daemon_helpers import DaemonProcess, alive, make_plan


def bare_interpreter() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def serving(address: str) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def one_run(groups: int) -> tuple[float, float]:
    plan = make_plan("bench", [(f"s{i}", f"g{i}", None, None) for i in range(groups)])
    daemon = DaemonProcess(plan)
    try:
        path = daemon.admin_address[len("unix:") :]
        start = time.perf_counter()
        daemon.start()
        deadline = start + 120
        while not (os.path.exists(path) and serving(daemon.admin_address)):
            if time.perf_counter() > deadline or daemon.proc.poll() is not None:
                raise RuntimeError(f"daemon with {groups} groups did not become READY:\n{daemon.log()}")
            time.sleep(0.01)
        ready = time.perf_counter() - start
        tree = daemon.track()
        stop_start = time.perf_counter()
        os.kill(daemon.pid, signal.SIGTERM)
        if daemon.proc.wait(timeout=60) != 0:
            raise RuntimeError(f"daemon did not stop cleanly:\n{daemon.log()}")
        while any(alive(pid) for pid in tree):
            time.sleep(0.005)
        stopped = time.perf_counter() - stop_start
    finally:
        daemon.__exit__(None, None, None)
    return ready, stopped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-groups", type=int, default=4)
    args = parser.parse_args()
    baseline = statistics.median(bare_interpreter() for _ in range(args.repeat))
    print(f"baseline: bare python interpreter start+exit {baseline * 1000:.0f} ms (median of {args.repeat})")
    print(f"{'groups':>6} {'start->READY':>14} {'x baseline':>10} {'READY->stopped':>15} {'x baseline':>10}")
    for groups in range(1, args.max_groups + 1):
        runs = [one_run(groups) for _ in range(args.repeat)]
        ready = statistics.median(r for r, _ in runs)
        stopped = statistics.median(s for _, s in runs)
        print(
            f"{groups:>6} {ready * 1000:>11.0f} ms {ready / baseline:>10.1f} "
            f"{stopped * 1000:>12.0f} ms {stopped / baseline:>10.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
