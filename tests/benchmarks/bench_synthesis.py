"""Benchmark: time to first audio and throughput, demo model colocated vs vocoder isolated.

Starts `stagevisor serve` twice in this run (declared topology, then
`--isolate-stage vocoder`), sends the same deterministic requests to each at
concurrency 1 and 8, and prints medians side by side with their ratio.

    python tests/benchmarks/bench_synthesis.py [--requests 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]

SENTENCE = "The quick brown fox jumps over the lazy dog, and the vocoder turns latent frames into speech."
OPTIONS = {"noise_scale": "0", "noise_w": "0"}


def start_daemon(workdir: str, placement: list[str]) -> tuple[subprocess.Popen, str]:
    listen = f"unix:{workdir}/synth.sock"
    env = dict(os.environ, STAGEVISOR_RUNTIME_DIR=workdir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stagevisor", "serve", "--listen", listen,
         "--admin-address", f"unix:{workdir}/admin.sock", "--log-level", "WARNING", *placement],
        env=env, cwd=ROOT,
    )
    return proc, listen


async def wait_serving(address: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"daemon at {address} not SERVING within {timeout} s")


async def one_request(stub) -> tuple[float, float, int]:
    """(time to first audio, total time, samples) for one request."""
    started = time.perf_counter()
    first = None
    samples = 0
    async for chunk in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=SENTENCE, options=OPTIONS)):
        if first is None:
            first = time.perf_counter() - started
        samples += len(chunk.pcm) // 2
    return first or 0.0, time.perf_counter() - started, samples


async def measure(address: str, concurrency: int, requests: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        await one_request(stub)  # warm up every stage once
        queue = list(range(requests))
        results: list[tuple[float, float, int]] = []

        async def client() -> None:
            while queue:
                queue.pop()
                results.append(await one_request(stub))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {
        "ttfa_ms": statistics.median(r[0] for r in results) * 1000,
        "latency_ms": statistics.median(r[1] for r in results) * 1000,
        "req_per_s": requests / wall,
    }


async def run_topology(placement: list[str], requests: int) -> dict[int, dict[str, float]]:
    workdir = tempfile.mkdtemp(prefix="svb", dir="/tmp")
    proc, listen = start_daemon(workdir, placement)
    try:
        await wait_serving(listen)
        return {c: await measure(listen, c, requests) for c in (1, 8)}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    colocated = asyncio.run(run_topology([], args.requests))
    isolated = asyncio.run(run_topology(["--isolate-stage", "vocoder"], args.requests))
    print(f"demo model, {args.requests} requests per row, noise 0; ratio = isolated / colocated")
    print(f"{'concurrency':>11} {'metric':>12} {'colocated':>10} {'isolated':>10} {'ratio':>7}")
    for c in (1, 8):
        for metric in ("ttfa_ms", "latency_ms", "req_per_s"):
            a, b = colocated[c][metric], isolated[c][metric]
            print(f"{c:>11} {metric:>12} {a:>10.1f} {b:>10.1f} {b / a:>7.2f}")
    delta = isolated[1]["ttfa_ms"] - colocated[1]["ttfa_ms"]
    print(f"isolating the vocoder changes median time to first audio by {delta:+.1f} ms at concurrency 1")


if __name__ == "__main__":
    main()
