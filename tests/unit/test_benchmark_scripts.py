"""The benchmarks in tests/benchmarks run by hand, so nothing else notices when the code they drive changes under
them: each part that drives the runtime's own objects in this process runs here on a few requests."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_handoff_benchmark_times_a_chain_of_in_process_edges():
    """bench_handoff.py called `runtime.runner.run`, which StageRuntime no longer has: its in-process line failed."""
    bench = benchmark("bench_handoff")
    edge, bare = asyncio.run(bench.time_in_process(bench.in_process_chain(3), 5))
    assert edge > 0 and bare > 0
