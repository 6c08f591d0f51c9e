"""Benchmark: the vocoder-isolation comparison on the GPU, with the torch stand-in of gpu_vocoder.py.

Starts `stagevisor serve --config tests/gpu/gpu_vocoder.yaml` twice in this run
(colocated, then `--isolate-stage vocoder`), sends the same requests at
concurrency 1 and 8, and prints medians side by side with their ratio. With
both stages on one GPU, the latent chunks cross by CUDA IPC when isolated.

    python tests/gpu/bench_gpu_vocoder.py [--requests 16]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_synthesis import run_topology  # noqa: E402

CONFIG = str(ROOT / "tests" / "gpu" / "gpu_vocoder.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    colocated = asyncio.run(run_topology(["--config", CONFIG], args.requests))
    isolated = asyncio.run(run_topology(["--config", CONFIG, "--isolate-stage", "vocoder"], args.requests))
    print(f"torch stand-in on GPU 0, {args.requests} requests per row; ratio = isolated / colocated")
    print(f"{'concurrency':>11} {'metric':>12} {'colocated':>10} {'isolated':>10} {'ratio':>7}")
    for c in (1, 8):
        for metric in ("ttfa_ms", "latency_ms", "req_per_s"):
            a, b = colocated[c][metric], isolated[c][metric]
            print(f"{c:>11} {metric:>12} {a:>10.1f} {b:>10.1f} {b / a:>7.2f}")


if __name__ == "__main__":
    main()
