"""Benchmark: the vocoder-isolation comparison on the GPU, with the torch stand-in of gpu_vocoder.py.

A fixed invocation of `stagevisor bench`: `--config tests/gpu/gpu_vocoder.yaml`
colocated and with `--isolate-stage vocoder`, each on a fresh daemon, the same
requests at concurrency 1 and 8, medians side by side with ratios from the
same run. With both stages on one GPU the latent chunks cross by CUDA IPC
when the vocoder is isolated.

    python tests/gpu/bench_gpu_vocoder.py [--requests 16] [--plot bench-gpu.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stagevisor.supervisor.cli import main

CONFIG = str(Path(__file__).resolve().parent / "gpu_vocoder.yaml")


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--plot")
    args = parser.parse_args()
    return main(
        [
            "bench",
            "--config",
            CONFIG,
            "--topology",
            "declared",
            "--topology",
            "--isolate-stage vocoder",
            "--concurrency",
            "1,8",
            "--requests",
            str(args.requests),
            *(["--plot", args.plot] if args.plot else []),
        ]
    )


if __name__ == "__main__":
    sys.exit(run())
