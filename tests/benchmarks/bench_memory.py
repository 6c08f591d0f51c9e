"""Benchmark: the memory a serving daemon holds, per process (daemon, fork server, each worker), after real requests.

Starts `stagevisor serve` (the demo by default) on private unix sockets,
sends `--requests` requests at concurrency 8 so every stage has run, then
reads each process of the daemon's tree with psutil: its resident set (RSS),
its proportional share (PSS: pages shared between processes counted once in
all) and its unique set (USS: what the process alone holds, freed when it
exits; workers forked from the fork server share its imported pages until
written). The PSS total is what the daemon really costs the machine.

    python tests/benchmarks/bench_memory.py [--requests 32] [-- serve arguments, e.g. --isolate-stage vocoder]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import psutil

from stagevisor.supervisor.bench.loadgen import GrpcClient, closed_loop
from stagevisor.supervisor.bench.daemon import Daemon

TEXTS = (
    "The quick brown fox jumps over the lazy dog, while the vocoder turns spectral frames into speech.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon, or call us to reschedule.",
)
MIB = 1024 * 1024


async def load(address: str, requests: int) -> int:
    client = GrpcClient(address, {})
    try:
        outcomes, _ = await closed_loop(client.request, TEXTS, 8, requests=requests)
    finally:
        await client.close()
    return sum(1 for o in outcomes if o.error)


def role(process: psutil.Process, daemon_pid: int) -> str:
    """What a process of the daemon's tree is, from its command line."""
    if process.pid == daemon_pid:
        return "daemon"
    line = " ".join(process.cmdline())
    if "resource_tracker" in line:
        return "multiprocessing resource tracker"
    if "forkserver" in line or "fork_server" in line:
        return "fork server"
    return f"worker ({line[-60:]})" if line else "worker"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("serve_args", nargs="*", help="after --: arguments for stagevisor serve")
    args = parser.parse_args()
    serve = args.serve_args or ["--model-path", "demo"]
    daemon = Daemon(serve, log=print)
    try:
        asyncio.run(daemon.wait_serving())
        errors = asyncio.run(load(daemon.listen, args.requests))
        groups = {pid: name for name, pid in asyncio.run(daemon.worker_pids()).items()}
        root = psutil.Process(daemon.proc.pid)
        rows = []
        for process in [root, *root.children(recursive=True)]:
            info = process.memory_full_info()
            name = f"worker {groups[process.pid]}" if process.pid in groups else role(process, root.pid)
            rows.append((name, process.pid, info.rss, info.pss, info.uss))
    finally:
        daemon.stop()
    print(f"stagevisor serve {' '.join(serve)}: {args.requests} requests at concurrency 8, {errors} failed")
    print("| process | pid | RSS | PSS | USS (its own) |")
    print("|---|---|---|---|---|")
    for name, pid, rss, pss, uss in rows:
        print(f"| {name} | {pid} | {rss / MIB:.0f} MiB | {pss / MIB:.0f} MiB | {uss / MIB:.0f} MiB |")
    total = [sum(row[i] for row in rows) / MIB for i in (2, 3, 4)]
    print(f"| all {len(rows)} | | {total[0]:.0f} MiB | {total[1]:.0f} MiB | {total[2]:.0f} MiB |")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
