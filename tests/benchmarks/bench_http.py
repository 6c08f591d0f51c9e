"""Benchmark: the HTTP speech API against gRPC Synthesize on one daemon, in one run.

Starts `stagevisor serve` (demo model, `--http 127.0.0.1:0`), then measures,
interleaving the transports request by request:
- concurrency 1: time to the first audio byte, gRPC vs HTTP streaming (`pcm`,
  `wav`; `mp3` for reference), medians with their interquartile range and the
  HTTP - gRPC delta;
- concurrency 8: requests per second, gRPC vs HTTP `pcm`, alternating rounds,
  and the ratio HTTP / gRPC.

The HTTP client is a minimal asyncio HTTP/1.1 reader (one connection per
request, chunked body), so the time measured is the daemon's, not a client
library's.

    python tests/benchmarks/bench_http.py [--requests 24] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog, and the vocoder turns latent frames into speech."
OPTIONS: dict[str, str] = {}  # the default voice is repeatable as is (noise seed 0)


def start_daemon(workdir: str) -> tuple[subprocess.Popen, str, str]:
    listen = f"unix:{workdir}/synth.sock"
    log_path = Path(workdir) / "daemon.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), STAGEVISOR_RUNTIME_DIR=workdir)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stagevisor",
                "serve",
                "--listen",
                listen,
                "--http",
                "127.0.0.1:0",
                "--admin-address",
                f"unix:{workdir}/admin.sock",
                "--log-level",
                "INFO",
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        found = re.search(r"HTTP API on http://([\d.]+:\d+)", text)
        if found and "READY:" in text:
            return proc, listen, found.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited:\n{text}")
        time.sleep(0.1)
    raise TimeoutError("daemon not READY within 120 s")


async def grpc_request(stub) -> tuple[float, float, int]:
    """(time to first audio byte, total, bytes)."""
    started = time.perf_counter()
    first, size = None, 0
    async for chunk in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=SENTENCE, options=OPTIONS)):
        if first is None and chunk.pcm:
            first = time.perf_counter() - started
        size += len(chunk.pcm)
    return first or 0.0, time.perf_counter() - started, size


async def http_request(address: str, fmt: str) -> tuple[float, float, int]:
    """(time to first audio byte, total, bytes) of one POST /v1/audio/speech on a new connection."""
    host, port = address.rsplit(":", 1)
    body = json.dumps(
        {"model": "demo", "input": SENTENCE, "response_format": fmt, **{k: float(v) for k, v in OPTIONS.items()}}
    ).encode()
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    first, size = None, 0
    while True:
        length = int((await reader.readline()).split(b";")[0], 16)
        if length == 0:
            await reader.readline()
            break
        await reader.readexactly(length)
        await reader.readline()
        if first is None:
            first = time.perf_counter() - started
        size += length
    writer.close()
    return first or 0.0, time.perf_counter() - started, size


def summary(values: list[float]) -> tuple[float, float]:
    """(median, interquartile range)."""
    quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return statistics.median(values), quartiles[2] - quartiles[0]


async def ttfa_c1(listen: str, address: str, requests: int) -> dict[str, list[float]]:
    """Time to first audio at concurrency 1, the transports interleaved request by request."""
    kinds = ("grpc", "pcm", "wav", "mp3")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    async with grpc.aio.insecure_channel(listen) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        for kind in kinds:  # warm up every path once
            await (grpc_request(stub) if kind == "grpc" else http_request(address, kind))
        for _ in range(requests):
            for kind in kinds:
                first, _, _ = await (grpc_request(stub) if kind == "grpc" else http_request(address, kind))
                results[kind].append(first * 1000)
    return results


async def throughput_c8(listen: str, address: str, requests: int, kind: str) -> float:
    """Requests per second with 8 clients sending `requests` requests in all."""
    async with grpc.aio.insecure_channel(listen) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        queue = list(range(requests))

        async def client() -> None:
            while queue:
                queue.pop()
                await (grpc_request(stub) if kind == "grpc" else http_request(address, "pcm"))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(8)))
        return requests / (time.perf_counter() - started)


async def bench(requests: int, rounds: int) -> None:
    workdir = tempfile.mkdtemp(prefix="svbh", dir="/tmp")
    proc, listen, address = start_daemon(workdir)
    try:
        c1 = await ttfa_c1(listen, address, requests)
        c8: dict[str, list[float]] = {"grpc": [], "http": []}
        for _ in range(rounds):
            for kind in ("grpc", "http"):
                c8[kind].append(await throughput_c8(listen, address, requests, kind))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"demo model, colocated; {requests} requests per transport at concurrency 1 (interleaved), "
        f"{rounds} alternating rounds of {requests} requests at concurrency 8"
    )
    grpc_median, grpc_iqr = summary(c1["grpc"])
    print(f"{'c1 time to first audio byte':<34} {'median ms':>10} {'IQR ms':>8} {'HTTP - gRPC ms':>15}")
    print(f"{'  gRPC Synthesize':<34} {grpc_median:>10.1f} {grpc_iqr:>8.1f} {'':>15}")
    for kind in ("pcm", "wav", "mp3"):
        median, iqr = summary(c1[kind])
        print(f"{'  HTTP ' + kind:<34} {median:>10.1f} {iqr:>8.1f} {median - grpc_median:>+15.1f}")
    grpc_rate, http_rate = statistics.median(c8["grpc"]), statistics.median(c8["http"])
    print(
        f"c8 throughput: gRPC {grpc_rate:.2f} req/s (rounds {', '.join(f'{r:.2f}' for r in c8['grpc'])}), "
        f"HTTP pcm {http_rate:.2f} req/s (rounds {', '.join(f'{r:.2f}' for r in c8['http'])}); "
        f"ratio HTTP / gRPC = {http_rate / grpc_rate:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(bench(args.requests, args.rounds))


if __name__ == "__main__":
    main()
