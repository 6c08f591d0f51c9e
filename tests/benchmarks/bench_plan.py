"""How long `stagevisor plan` takes as a whole process, per built-in model, next to `python -c pass`.

Run by hand (not collected by pytest), with stagevisor installed (`pip install -e '.[test]'`):

    python tests/benchmarks/bench_plan.py [--runs 7]

Prints the median wall time of each command over several runs and its ratio
to a bare interpreter start measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from stagevisor.models.registry import builtin_models

ROOT = Path(__file__).resolve().parents[2]


def median_seconds(argv: list[str], runs: int, env: dict[str, str]) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples.append(time.perf_counter() - start)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.decode()}")
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per command (median reported)")
    args = parser.parse_args()
    env = dict(os.environ)

    baseline = median_seconds([sys.executable, "-c", "pass"], args.runs, env)
    print(f"{'command':<44} {'median':>9} {'x python -c pass':>17}")
    print(f"{'python -c pass':<44} {baseline * 1000:>7.1f}ms {1.0:>17.2f}")
    worst = 0.0
    for declaration in builtin_models():
        seconds = median_seconds(
            [sys.executable, "-m", "stagevisor", "plan", "--model-path", declaration.key], args.runs, env
        )
        worst = max(worst, seconds)
        label = f"plan --model-path {declaration.key}"
        print(f"{label:<44} {seconds * 1000:>7.1f}ms {seconds / baseline:>17.2f}")
    models = median_seconds([sys.executable, "-m", "stagevisor", "models"], args.runs, env)
    print(f"{'models':<44} {models * 1000:>7.1f}ms {models / baseline:>17.2f}")
    print(f"slowest plan: {worst * 1000:.1f} ms ({'under' if worst < 1.0 else 'OVER'} one second)")


if __name__ == "__main__":
    main()
