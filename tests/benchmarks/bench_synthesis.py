"""Benchmark: time to first audio and throughput, demo model colocated vs vocoder isolated.

A fixed invocation of `stagevisor bench` (the one load generator in the
repository): a fresh daemon per topology, the same deterministic requests at
concurrency 1 and 8, medians and percentiles side by side with ratios from
the same run, and a check that both topologies produced identical audio.

    python tests/benchmarks/bench_synthesis.py [--requests 16] [--plot bench.png]
"""

from __future__ import annotations

import argparse
import sys

from stagevisor.supervisor.cli import main


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--plot")
    args = parser.parse_args()
    return main(
        [
            "bench",
            "--model-path",
            "demo",
            "--topology",
            "declared",
            "--topology",
            "--isolate-stage vocoder",
            "--concurrency",
            "1,8",
            "--requests",
            str(args.requests),
            "--check-identical",
            *(["--plot", args.plot] if args.plot else []),
        ]
    )


if __name__ == "__main__":
    sys.exit(run())
