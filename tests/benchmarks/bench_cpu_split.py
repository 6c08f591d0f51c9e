"""Benchmark: where the default voice's CPU per request goes when stagevisor serves it, by process and thread.

Serves the four texts of bench_hibari.py (seed 0) from a demo daemon over gRPC
at one concurrency and reads, around each measured run, the CPU time
(user + system) of this process (the clients), of the daemon and of every
process under it, each split into its main thread (the asyncio loop: gRPC
handlers, data-plane links, codec, metrics) and its other threads (a
worker's compute pool, gRPC's own threads). Beside it, hibari's own
in-process synthesis of the same texts at the same concurrency, interleaved
run by run, for the CPU a request costs without any serving. Each row is the
median over repetitions with its min-max spread.

    python tests/benchmarks/bench_cpu_split.py [--repeats 5] [--requests 64] [--concurrency 8] [--isolate-vocoder]

CPU times come from the kernel in clock ticks (10 ms), so use enough requests
per run that a tick is small against a thread's share (64 requests: 0.16 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import psutil
from bench_hibari import run_hibari, run_stagevisor

from stagevisor.supervisor.bench.daemon import Daemon


def thread_seconds(process: psutil.Process) -> tuple[float, float]:
    """(main thread, all other threads) CPU seconds of `process`; its main thread's id is its pid."""
    main = other = 0.0
    for thread in process.threads():
        seconds = thread.user_time + thread.system_time
        if thread.id == process.pid:
            main += seconds
        else:
            other += seconds
    return main, other


def label(process: psutil.Process, root: int) -> str:
    """`daemon`, `worker sv:GROUP` (a worker names its process after its group) or the helper's command."""
    if process.pid == root:
        return "daemon"
    name = process.name()
    if name.startswith("sv:"):
        return f"worker {name}"
    return " ".join(process.cmdline())[-40:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--isolate-vocoder", action="store_true", help="serve with --isolate-stage vocoder")
    args = parser.parse_args()
    from hibari import Hibari

    tts = Hibari()
    run_hibari(tts, 1, 2)  # warm-up: the G2P tables and the session's first runs
    extra = ["--isolate-stage", "vocoder"] if args.isolate_vocoder else []
    daemon = Daemon(["--model-path", "demo", *extra], log=print)
    me = psutil.Process()
    rows: dict[str, list[float]] = {}
    package: list[float] = []
    load_before = os.getloadavg()
    try:
        asyncio.run(daemon.wait_serving())
        asyncio.run(run_stagevisor(daemon.listen, 2, 4))  # warm-up
        root = psutil.Process(daemon.proc.pid)
        tree = [root, *root.children(recursive=True)]
        names = {p.pid: label(p, root.pid) for p in tree}
        for repeat in range(args.repeats):
            started = time.process_time()
            run_hibari(tts, args.concurrency, args.requests)
            package.append((time.process_time() - started) / args.requests)
            before = {p.pid: thread_seconds(p) for p in tree}
            client = sum(me.cpu_times()[:2])
            asyncio.run(run_stagevisor(daemon.listen, args.concurrency, args.requests))
            client = sum(me.cpu_times()[:2]) - client
            after = {p.pid: thread_seconds(p) for p in tree}
            rows.setdefault("clients (this process)", []).append(client / args.requests)
            total = client
            for p in tree:
                for index, part in enumerate(("main thread", "other threads")):
                    used = after[p.pid][index] - before[p.pid][index]
                    rows.setdefault(f"{names[p.pid]}, {part}", []).append(used / args.requests)
                    total += used
            rows.setdefault("stagevisor, all of the above", []).append(total / args.requests)
            print(f"repetition {repeat + 1}/{args.repeats} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    finally:
        daemon.stop()
    rows["hibari in process (the package alone)"] = package

    print(
        f"{args.requests} requests per run at concurrency {args.concurrency}, {args.repeats} interleaved repetitions, "
        f"demo model{' with the vocoder isolated' if args.isolate_vocoder else ', declared'}; median [min-max]; "
        f"cpus={os.cpu_count()}, load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print("| where | CPU ms / request |")
    print("|---|---|")
    for name, values in rows.items():
        if max(values) < 0.05e-3:
            continue
        median = statistics.median(values) * 1000
        print(f"| {name} | {median:.2f} [{min(values) * 1000:.2f}-{max(values) * 1000:.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
