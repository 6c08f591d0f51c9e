"""Benchmark: the default voice (hibari) served by stagevisor against hibari's own in-process synthesis, same texts.

hibari in process (`Hibari().stream(text, seed=0)`: one shared instance at the
package's defaults, one onnxruntime thread, sentences yielded as they are
made; at concurrency c, c threads call it at once) against stagevisor's demo
model over gRPC, declared and with the vocoder isolated, at concurrency 1 and
8, with the CPU each request cost (this process, which runs the clients or
hibari, plus every process of the daemon). Every configuration runs
`--repeats` times, interleaved (all systems once,
then all again), so drift on a shared machine hits them alike; each cell is
the median over repetitions with its min-max spread, and ratios are between
medians of this run. Targets (DESIGN section 8): at least as many audio
seconds per wall second as hibari's own synthesis, and at most half its
median time to first audio.

    python tests/benchmarks/bench_hibari.py [--repeats 3] [--requests 16] [--multi] [--concurrency 1 8] [--replicas 2]
        [--compare-python PYTHON ...] [--declared-only]

`--replicas N` also serves the declared topology with N replicas of its one
process group (`--process-replicas pipeline=N`): N worker processes, each
with its own GIL, compute pool and memory.

`--multi` sends the four texts as one request (four sentences).

Every request uses seed 0 on both sides, as every request that names no seed
does; `--fresh-seeds` gives each request a seed no request used before (both
sides), so the vocoder's kept noise draw never helps, as for clients that
send a seed of their own each time.

At concurrency c the c clients start at the same instant, so a run's first c
requests arrive together; the rest arrive as others end, as on a running
server. Use at least 4c requests (32 at c8) for first audio at c8 that is
mostly the steady state's; it prints a note when a run is mostly that burst.

`--compare-python PYTHON` also serves the declared topology from another
interpreter, e.g. the venv of a checkout of an earlier commit, so a change is
measured against the code before it in the same interleaved run; give it
more than once to compare several. `--declared-only` leaves out the vocoder
isolated (and --replicas), for a quicker comparison of changes.

It also prints where one-sentence first audio goes at concurrency 1, timed in
this process on the same texts (medians over repetitions): G2P, the acoustic
pass, the package's whole-sentence DSP, the sentence's noise draw (the
vocoder makes it while the acoustic pass runs) and the vocoder's DSP before
its first audio (16 frames), and the rest of the sentence's DSP on one thread
(what the vocoder does, a run at a time) and split across two (what it did
before: two threads were no faster here), so the
least first-audio ratio any pipeline could reach without changing the
samples reads off the table; what stagevisor measures above that is
handoffs, gRPC and cores shared with other work.
"""

from __future__ import annotations

import argparse
import itertools
import asyncio
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from stagevisor.supervisor.bench.loadgen import GrpcClient, Outcome, closed_loop, summarize
from stagevisor.supervisor.bench.daemon import Daemon
from stagevisor.supervisor.metrics.playback import Playback

TEXTS = (
    "The quick brown fox jumps over the lazy dog, while the vocoder turns spectral frames into speech.",
    "A supervisor decides where each stage runs, and a measurement on the real workload says which is faster.",
    "Streaming synthesis sends the first audio while the rest of the text is still being generated.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon, or call us to reschedule.",
)
SEED = 0
FRESH_SEEDS: itertools.count | None = None
"""With --fresh-seeds: the seeds requests take in turn, none used before, on both sides."""


def next_seed() -> int:
    """The seed of the next request: SEED, or with --fresh-seeds one no request has used."""
    return SEED if FRESH_SEEDS is None else next(FRESH_SEEDS)


def run_hibari(tts, concurrency: int, requests: int) -> dict:
    lock = threading.Lock()
    outcomes: list[Outcome] = []

    def one(index: int) -> None:
        started = time.perf_counter()
        first, samples, playback = None, 0, Playback()
        for audio in tts.stream(TEXTS[index % len(TEXTS)], seed=next_seed()):
            now = time.perf_counter()
            first = first or now - started
            samples += len(audio)
            playback.arrived(now, len(audio) / tts.sample_rate)
        with lock:
            total = time.perf_counter() - started
            outcomes.append(Outcome(index, started, first, total, samples, tts.sample_rate, stall=playback.stall))

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    return summarize(outcomes, time.perf_counter() - started).to_json()


def breakdown(tts, repeats: int) -> dict[str, float]:
    """Median seconds of each part of one sentence's synthesis, over repetitions of every text."""
    import numpy as np
    from hibari import dsp

    from stagevisor.stages.hibari.executors import noise_frames_hint
    from stagevisor.stages.hibari.render import NoiseBook, RequestNoise, SentenceRenderer, draw_noise
    from stagevisor.stages.hibari.voice import BINS, SPECTRAL_PARTS

    times: dict[str, list[float]] = {}

    def timed(name: str, fn, *args):
        started = time.perf_counter()
        result = fn(*args)
        times.setdefault(name, []).append(time.perf_counter() - started)
        return result

    def first_run(frames: dict, noise: RequestNoise) -> np.ndarray | None:
        return next(SentenceRenderer(frames, noise.take(frames["f0"].shape[0])).runs(), None)

    split = ThreadPoolExecutor(2)

    def rest_of_sentence(frames: dict, threads: int) -> None:
        """The DSP after a sentence's first run (noise already drawn), on one thread or split across two."""
        renderer = SentenceRenderer(frames, draw_noise(np.random.default_rng(SEED), BINS, frames["f0"].shape[0]))
        (_, first), *_ = renderer.ranges()
        renderer.compute(0, first)
        started = time.perf_counter()
        middle = (first + renderer.frames) // 2
        pieces = [(first, renderer.frames)] if threads == 1 else [(first, middle), (middle, renderer.frames)]
        list(split.map(lambda bounds: renderer.compute(*bounds), pieces))
        times.setdefault(f"vocoder DSP after the first run, {threads} thread(s)", []).append(
            time.perf_counter() - started
        )

    for _ in range(repeats):
        for text in TEXTS:
            phonemes = timed("G2P (phonemize)", tts.phonemize, text)[0]
            feeds = {"ids": np.asarray([tts.ids(phonemes)], np.int64), "speed": np.ones(1, np.float32)}
            outputs = timed("acoustic pass (onnxruntime, 1 thread)", tts.sess.run, None, feeds)
            frames = dict(zip((*SPECTRAL_PARTS, "f0"), (o[0] for o in outputs), strict=True))
            parts = [frames[n] for n in SPECTRAL_PARTS]
            rng = np.random.default_rng(SEED)
            timed("package DSP, whole sentence (dsp.synth)", dsp.synth, *parts, frames["f0"], rng)
            noise = (frames["lh"].shape[0], 2 * frames["f0"].shape[0])
            timed(
                "the sentence's noise draw (the vocoder's runs during the acoustic pass)",
                rng.standard_normal,
                noise,
                np.float32,
            )
            cold = NoiseBook(BINS, seeds=1, limit_frames=frames["f0"].shape[0]).request(SEED)
            cold.ahead(noise_frames_hint(feeds["ids"].shape[1], 1.0))
            timed("vocoder DSP before first audio, noise drawn ahead (16 frames)", first_run, frames, cold)
            kept = NoiseBook(BINS, seeds=1, limit_frames=frames["f0"].shape[0])
            kept.request(SEED).take(frames["f0"].shape[0])
            timed(
                "vocoder DSP before first audio, seed's noise kept (16 frames)", first_run, frames, kept.request(SEED)
            )
            rest_of_sentence(frames, 1)
            rest_of_sentence(frames, 2)
    return {name: statistics.median(values) for name, values in times.items()}


def process_tree(pid: int) -> list:
    """The daemon's process and every process under it (fork server, workers), as psutil.Process objects."""
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(processes: list) -> float:
    """User + system CPU seconds of this process (the clients or hibari in process) and of `processes`."""
    import psutil

    total = 0.0
    for process in [psutil.Process(), *processes]:
        times = process.cpu_times()
        total += times.user + times.system
    return total


async def run_stagevisor(address: str, concurrency: int, requests: int) -> dict:
    client = GrpcClient(address, {"seed": str(SEED)})

    async def request(index: int, text: str) -> Outcome:
        return await client.request(index, text, {"seed": str(next_seed())})

    try:
        outcomes, wall = await closed_loop(request, TEXTS, concurrency, requests=requests)
    finally:
        await client.close()
    return summarize(outcomes, wall).to_json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--multi", action="store_true", help="all four texts in every request")
    parser.add_argument(
        "--fresh-seeds",
        action="store_true",
        help="every request a seed no request used before, on both sides (default: all seed 0, as requests that "
        "name no seed): the vocoder's kept noise draws then never help",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--replicas", type=int, default=0, help="also the declared topology with N pipeline workers")
    parser.add_argument(
        "--compare-python",
        metavar="PYTHON",
        action="append",
        default=[],
        help="also the declared topology served by this interpreter (another checkout's venv, to compare a change); "
        "more than once to compare several",
    )
    parser.add_argument(
        "--declared-only", action="store_true", help="no vocoder-isolated topology (nor --replicas): quicker"
    )
    args = parser.parse_args()
    global TEXTS, FRESH_SEEDS
    if args.fresh_seeds:
        FRESH_SEEDS = itertools.count(1)
    if args.multi:
        TEXTS = (" ".join(TEXTS),)
    from hibari import Hibari

    tts = Hibari()
    run_hibari(tts, 1, 2)  # warm-up: the G2P tables and the session's first runs
    parts = breakdown(tts, args.repeats)
    systems = ["hibari in process"]
    daemons = {"stagevisor, declared": Daemon(["--model-path", "demo"], log=print)}
    if not args.declared_only:
        daemons["stagevisor, vocoder isolated"] = Daemon(
            ["--model-path", "demo", "--isolate-stage", "vocoder"], log=print
        )
    if args.replicas > 1 and not args.declared_only:
        daemons[f"stagevisor, pipeline x{args.replicas}"] = Daemon(
            ["--model-path", "demo", "--process-replicas", f"pipeline={args.replicas}"], log=print
        )
    for python in args.compare_python:
        label = "--compare-python" if len(args.compare_python) == 1 else python
        daemons[f"stagevisor ({label}), declared"] = Daemon(["--model-path", "demo"], log=print, python=python)
    results: dict[tuple[str, int], list[dict]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}  # CPU seconds per request: this process plus the daemon's tree
    load_before = os.getloadavg()
    try:
        for daemon in daemons.values():
            asyncio.run(daemon.wait_serving())
            asyncio.run(run_stagevisor(daemon.listen, 1, 2))  # warm-up
        trees = {name: process_tree(daemon.proc.pid) for name, daemon in daemons.items()}
        for repeat in range(args.repeats):
            for c in args.concurrency:
                before = cpu_seconds([])
                results.setdefault((systems[0], c), []).append(run_hibari(tts, c, args.requests))
                cpu.setdefault((systems[0], c), []).append((cpu_seconds([]) - before) / args.requests)
                for name, daemon in daemons.items():
                    before = cpu_seconds(trees[name])
                    results.setdefault((name, c), []).append(
                        asyncio.run(run_stagevisor(daemon.listen, c, args.requests))
                    )
                    cpu.setdefault((name, c), []).append((cpu_seconds(trees[name]) - before) / args.requests)
            print(f"repetition {repeat + 1}/{args.repeats} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    load_after = os.getloadavg()

    def cell(name: str, c: int, key: str) -> tuple[float, float, float]:
        values = [r["ttfa"]["p50"] if key == "ttfa" else r[key] for r in results[(name, c)]]
        return statistics.median(values), min(values), max(values)

    print(
        f"{args.requests} requests per cell, {args.repeats} interleaved repetitions, "
        f"{'one four-sentence text' if args.multi else 'four one-sentence texts'}, "
        f"{'a new seed each request' if args.fresh_seeds else f'seed {SEED}'}; median [min-max]; "
        f"cpus={os.cpu_count()}, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    burst = [c for c in args.concurrency if c > 1 and args.requests < 4 * c]
    if burst:
        print(
            f"note: at c{burst[0]} the first {burst[0]} requests of a run start at the same instant; with fewer "
            f"than {4 * burst[0]} requests most of the run is that burst, so its first audio is a burst's, not a "
            "running server's"
        )
    print("| system | c | first audio p50 | audio s / wall s | CPU ms / request | stalled | errors |")
    print("|---|---|---|---|---|---|---|")
    for c in args.concurrency:
        for name in (*systems, *daemons):
            t, tl, th = cell(name, c, "ttfa")
            a, al, ah = cell(name, c, "audio_seconds_per_second")
            errors = sum(sum(r["errors"].values()) for r in results[(name, c)])
            ttfa = f"{t * 1000:.0f} ms [{tl * 1000:.0f}-{th * 1000:.0f}]"
            used = statistics.median(cpu[(name, c)]) * 1000
            stalled = statistics.median(r["stalled"] or 0.0 for r in results[(name, c)])
            print(f"| {name} | {c} | {ttfa} | {a:.2f} [{al:.2f}-{ah:.2f}] | {used:.1f} | {stalled:.0%} | {errors} |")
    print("ratios of medians (stagevisor / hibari in process); targets: audio/s >= 1.00x, first audio <= 0.50x")
    for c in args.concurrency:
        for name in daemons:
            a = cell(name, c, "audio_seconds_per_second")[0] / cell(systems[0], c, "audio_seconds_per_second")[0]
            t = cell(name, c, "ttfa")[0] / cell(systems[0], c, "ttfa")[0]
            print(
                f"  c{c} {name}: audio/s {a:.2f}x ({'met' if a >= 1.0 else 'NOT met'}), "
                f"first audio {t:.2f}x ({'met' if t <= 0.5 else 'NOT met'})"
            )
    g2p, acoustic, whole, _, first, *_ = parts.values()
    print(f"one sentence in this process, median of {args.repeats} x {len(TEXTS)}:")
    for name, seconds in parts.items():
        print(f"  {name}: {seconds * 1000:.1f} ms")
    print(
        f"  least first-audio ratio without handoffs, noise drawn on a free core: "
        f"({g2p * 1000:.1f} + {acoustic * 1000:.1f} + {first * 1000:.1f})"
        f" / ({g2p * 1000:.1f} + {acoustic * 1000:.1f} + {whole * 1000:.1f}) = "
        f"{(g2p + acoustic + first) / (g2p + acoustic + whole):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
