"""Benchmark: first audio of a one-sentence and a 40-sentence text, served by stagevisor, against a checkout before.

Serves a model (`--model demo`, the default voice, or `piper`) from this
checkout and, with `--compare-python PYTHON`, from another interpreter (the
venv of a checkout of an earlier commit, or a wrapper that puts one on
PYTHONPATH), and sends one request at a time: the one-sentence text, then the
same four sentences repeated to `--sentences` sentences (about 100 characters
each; 40 make about 4,000 characters). Every configuration runs `--repeats`
times, interleaved (every daemon and text once, then all again); each cell is
the median over repetitions of a run's median first audio, with the min-max
spread, and the ratios are between medians of this run: long text against one
sentence on each daemon, and this checkout against the other on each text. It
also says whether the daemons' audio was the same, byte for byte (piper's with
both noise scales at 0, which makes it the same run to run).

    python tests/benchmarks/bench_long_text.py [--model demo] [--repeats 7] [--requests 4] [--sentences 40]
        [--compare-python PYTHON]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys

from stagevisor.supervisor.bench.loadgen import GrpcClient, closed_loop
from stagevisor.supervisor.bench.daemon import Daemon

SENTENCES = (
    "The quick brown fox jumps over the lazy dog, while the vocoder turns spectral frames into speech.",
    "A supervisor decides where each stage runs, and a measurement on the real workload says which is faster.",
    "Streaming synthesis sends the first audio while the rest of the text is still being generated.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon, or call us to reschedule.",
)


DETERMINISTIC = {"demo": {}, "piper": {"noise_scale": "0", "noise_w": "0"}}
"""Options that make each model's audio the same run to run (the demo's default seed already does)."""


async def first_audio(address: str, text: str, requests: int, options: dict[str, str]) -> tuple[float, set[str], int]:
    """(median first audio in seconds, the audio digests, failed requests) of `requests` requests, one at a time."""
    client = GrpcClient(address, options)
    try:
        outcomes, _ = await closed_loop(client.request, [text], 1, requests=requests)
    finally:
        await client.close()
    ok = [o for o in outcomes if o.error is None and o.first_audio is not None]
    return statistics.median(o.first_audio for o in ok), {o.digest for o in ok}, len(outcomes) - len(ok)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", choices=["demo", "piper"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=4, help="requests per cell and repetition, one at a time")
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--compare-python", metavar="PYTHON", help="also serve the model from this interpreter")
    args = parser.parse_args()
    if args.repeats < 1 or args.requests < 1 or args.sentences < 2:
        parser.error("--repeats and --requests must be at least 1, --sentences at least 2")
    texts = {
        "1 sentence": SENTENCES[0],
        f"{args.sentences} sentences": " ".join(SENTENCES[i % len(SENTENCES)] for i in range(args.sentences)),
    }
    options = DETERMINISTIC[args.model]
    daemons = {"this checkout": Daemon(["--model-path", args.model], log=print)}
    if args.compare_python:
        daemons["--compare-python"] = Daemon(["--model-path", args.model], log=print, python=args.compare_python)
    cells: dict[tuple[str, str], list[float]] = {}
    digests: dict[tuple[str, str], set[str]] = {}
    failed = 0
    load_before = os.getloadavg()
    try:
        for daemon in daemons.values():
            asyncio.run(daemon.wait_serving())
            for text in texts.values():
                asyncio.run(first_audio(daemon.listen, text, 2, options))  # warm-up
        for repeat in range(args.repeats):
            for label, text in texts.items():
                for name, daemon in daemons.items():
                    median, seen, errors = asyncio.run(first_audio(daemon.listen, text, args.requests, options))
                    cells.setdefault((name, label), []).append(median)
                    digests.setdefault(label, set()).update(seen)
                    failed += errors
            print(f"repetition {repeat + 1}/{args.repeats} done (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    load_after = os.getloadavg()

    def median(name: str, label: str) -> float:
        return statistics.median(cells[(name, label)])

    print(
        f"model {args.model}, one request at a time, {args.requests} requests per cell, {args.repeats} interleaved "
        f"repetitions; median [min-max] of each repetition's median; cpus={os.cpu_count()}, load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; failed requests: {failed}"
    )
    print("| system | text | characters | first audio p50 |")
    print("|---|---|---|---|")
    for name in daemons:
        for label, text in texts.items():
            values = cells[(name, label)]
            spread = f"[{min(values) * 1000:.1f}-{max(values) * 1000:.1f}]"
            print(f"| {name} | {label} | {len(text)} | {median(name, label) * 1000:.1f} ms {spread} |")
    one, long = texts
    for name in daemons:
        print(f"  {name}: {long} / {one}: {median(name, long) / median(name, one):.2f}x")
    if len(daemons) > 1:
        for label in texts:
            ratio = median("this checkout", label) / median("--compare-python", label)
            print(f"  {label}: this checkout / --compare-python: {ratio:.2f}x")
    same = all(len(digests[label]) == 1 for label in texts)
    print(f"  the same audio from every daemon and request, per text: {'yes' if same else 'NO'}")
    return 0 if same and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
