"""Benchmark: what metrics collection costs — throughput at concurrency 8 on vs off, and the in-process edge.

Run by hand from the repository root (not collected by pytest):

    PYTHONPATH=$PWD python tests/benchmarks/bench_metrics.py [--rounds 5] [--requests 24]

1. Two daemons serve the demo model with the vocoder isolated (a cross-process
   edge, so worker reports and handoff accounting run): one with metrics on
   (and /metrics scraped every second, as Prometheus would), one with
   --no-metrics. Rounds alternate between them; each round sends --requests
   requests at concurrency 8. Prints the median requests/s of each, the spread,
   and the ratio on/off (target: >= 0.97).
2. A chain of 10 pass-through in-process stages run by StageRuntime without a
   Recorder, with one (reporting every REPORT_INTERVAL, as a worker's node
   does), with one that times every chain (no sampling: what per-call timing
   alone costs), and as bare awaited calls, interleaved in each round. The
   recorder reports every REPORT_INTERVAL of this thread's CPU time: a worker
   with a core to itself (on a loaded machine a worker's wall-clock reports
   come after fewer requests, so a larger share of them is timed, still at
   most 1000 chains a second; the share is printed). Prints
   the thread CPU time per hop (CPU time, not wall time: other jobs on the
   machine do not count) and the median over rounds of each round's ratio to
   the recorder-off run (target: on/off within noise of 1.0; DESIGN.md: the
   edge stays within 1.5x of a bare call).

Both ratios come from one run; `uptime` is printed first for the load.
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc  # noqa: E402

CONCURRENCY = 8
SENTENCE = "The quick brown fox jumps over the lazy dog, and the vocoder turns latent frames into speech."
OPTIONS: dict[str, str] = {}  # the default voice is repeatable as is (noise seed 0)


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


def start(workdir: str, extra: list[str]) -> tuple[subprocess.Popen, str, str]:
    listen = f"unix:{workdir}/synth.sock"
    admin = f"unix:{workdir}/admin.sock"
    env = dict(os.environ, PYTHONPATH=str(ROOT), STAGEVISOR_RUNTIME_DIR=workdir)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stagevisor",
            "serve",
            "--isolate-stage",
            "vocoder",
            "--listen",
            listen,
            "--admin-address",
            admin,
            "--http",
            "none",
            "--log-level",
            "WARNING",
            *extra,
        ],
        env=env,
        cwd=ROOT,
    )
    return proc, listen, admin


def metrics_url(admin: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "stagevisor", "status", "--format", "json", "--admin-address", admin],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
    )
    import json

    return json.loads(out.stdout)["metrics_url"]


async def round_trip(address: str, requests: int, scrape: str | None) -> float:
    """Requests per second of `requests` requests at concurrency 8 (scraping `scrape` each second)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        queue = list(range(requests))

        async def client() -> None:
            while queue:
                queue.pop()
                async for _ in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=SENTENCE, options=OPTIONS)):
                    pass

        async def scraper() -> None:
            while True:
                await asyncio.sleep(1.0)
                await asyncio.to_thread(lambda: urllib.request.urlopen(scrape, timeout=5).read())

        task = asyncio.create_task(scraper()) if scrape else None
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - started
        if task is not None:
            task.cancel()
    return requests / wall


async def throughput(rounds: int, requests: int) -> tuple[list[float], list[float]]:
    dirs = [tempfile.mkdtemp(prefix="svm", dir="/tmp") for _ in range(2)]
    on = start(dirs[0], ["--metrics", "127.0.0.1:0"])
    off = start(dirs[1], ["--no-metrics"])
    try:
        for _, listen, _ in (on, off):
            await wait_serving(listen)
        url = metrics_url(on[2])
        for _, listen, _ in (on, off):  # warm every stage once
            await round_trip(listen, CONCURRENCY, None)
        rates_on, rates_off = [], []
        for index in range(rounds):
            order = [(on, rates_on, url), (off, rates_off, None)]
            for (_, listen, _), rates, scrape in order if index % 2 == 0 else order[::-1]:
                rates.append(await round_trip(listen, requests, scrape))
        return rates_on, rates_off
    finally:
        for proc, _, _ in (on, off):
            proc.send_signal(signal.SIGTERM)
        for proc, _, _ in (on, off):
            proc.wait(timeout=60)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


class PassThrough:
    async def process(self, payload, ctx):
        return payload.data


TIMED: list[float] = []
"""The share of stage calls timed in each recorder-on run."""


async def in_process(stages: int, count: int, recording: bool, time_every_chain: bool = False) -> float:
    """Thread CPU seconds per request through `stages` in-process stages run by StageRuntime."""
    import numpy as np

    from stagevisor.stages.base import StagePayload
    from stagevisor.supervisor.dataplane.codec import Codec
    from stagevisor.supervisor.dataplane.invocation import Invocation
    from stagevisor.supervisor.dataplane.request_state import RequestState
    from stagevisor.supervisor.dataplane.runtime import StageRuntime
    from stagevisor.supervisor.metrics.recorder import REPORT_INTERVAL, Recorder
    from stagevisor.supervisor.plan import PlannedStage

    names = [f"s{i}" for i in range(stages)]
    planned = {
        n: PlannedStage(
            name=n,
            process="p",
            gpu=None,
            tp_size=1,
            total_gpu_memory_fraction=None,
            fraction_source=None,
            factory=None,
            next=tuple(names[i + 1 : i + 2]),
        )
        for i, n in enumerate(names)
    }
    recorder = None
    if recording:
        recorder = Recorder("p", **({"timed_per_report": count} if time_every_chain else {}))
    runtime = StageRuntime(
        planned, {n: PassThrough() for n in names}, {}, "unix:/unused", "bench", Codec(), recorder=recorder
    )

    class NullLink:
        async def send_async(self, frame, out=None):
            pass

    null = NullLink()

    class NullLinks:
        def get(self, address):
            return null

    runtime.links = NullLinks()
    data = {"tensor": np.ones(64, dtype=np.float32), "step": 1}
    request = {"text": "x"}
    calls: dict[str, int] = dict.fromkeys(names, 0)
    timed = [0]

    def report() -> None:
        stats = recorder.collect()
        for stage in stats.stages if stats is not None else ():
            calls[stage.stage] += stage.calls
            timed[0] += stage.count

    started = time.thread_time()
    reported = time.thread_time()
    for index in range(count):
        state = RequestState(str(index))
        await runtime.runner.run(
            Invocation(runtime.emitter, state, names[0], StagePayload(state.request_id, request, data), None)
        )
        if recorder is not None and index % 64 == 63 and time.thread_time() - reported >= REPORT_INTERVAL:
            report()  # as the node's reporter does every REPORT_INTERVAL
            reported = time.thread_time()
    elapsed = time.thread_time() - started
    if recorder is not None:
        report()
        assert set(calls.values()) == {count}, f"the recorder lost calls: {calls}"
        if not time_every_chain:
            TIMED.append(timed[0] / (count * stages))
    return elapsed / count


async def bare(stages: int, count: int) -> float:
    from stagevisor.stages.base import StagePayload

    executors = [PassThrough() for _ in range(stages)]
    data, request = {"step": 1}, {"text": "x"}
    started = time.thread_time()
    for index in range(count):
        payload = StagePayload(str(index), request, data)
        for executor in executors:
            payload = StagePayload(payload.request_id, request, await executor.process(payload, None))
    return (time.thread_time() - started) / count


def spread(values: list[float]) -> str:
    return f"[{min(values):.3g} .. {max(values):.3g}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--hops", type=int, default=20000, help="requests per in-process measurement")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())

    stages = 10
    runs = {
        "off": lambda: in_process(stages, args.hops, False),
        "on": lambda: in_process(stages, args.hops, True),
        "every": lambda: in_process(stages, args.hops, True, time_every_chain=True),
        "bare": lambda: bare(stages, args.hops),
    }
    per_hop: dict[str, list[float]] = {name: [] for name in runs}
    loop = asyncio.new_event_loop()
    for index in range(args.rounds):
        names = list(runs)
        for name in names[index % len(names) :] + names[: index % len(names)]:  # rotate the order per round
            per_hop[name].append(loop.run_until_complete(runs[name]()) / (stages - 1))
    loop.close()

    def ratio(name: str, base: str = "off") -> float:
        return statistics.median(a / b for a, b in zip(per_hop[name], per_hop[base], strict=True))

    print(
        f"in-process edge, {stages} stages, {args.rounds} rounds of {args.hops} requests each "
        "(thread CPU time per hop; medians)"
    )
    labels = {
        "off": "recorder off",
        "on": "recorder on",
        "every": "recorder on, every chain timed",
        "bare": "bare awaited call",
    }
    for name, label in labels.items():
        values = [v * 1e6 for v in per_hop[name]]
        print(f"  {label + ':':<32} {statistics.median(values):.2f} us per hop {spread(values)}")
    hop_ratio = ratio("on")
    print(
        f"  ratio on/off {hop_ratio:.3f}; every-chain-timed/off {ratio('every'):.3f}; "
        f"off/bare {1 / ratio('bare'):.2f} (medians of per-round ratios); "
        f"recorder on timed {statistics.median(TIMED):.1%} of the calls"
    )

    if args.skip_throughput:
        print(f"RATIOS in-process hop on/off {hop_ratio:.3f}")
        return
    rates_on, rates_off = asyncio.run(throughput(args.rounds, args.requests))
    a, z = statistics.median(rates_on), statistics.median(rates_off)
    print(
        f"demo model, vocoder isolated, concurrency {CONCURRENCY}, {args.rounds} alternating rounds of "
        f"{args.requests} requests"
    )
    print(f"  metrics on (scraped every 1 s): {a:.2f} req/s {spread(rates_on)}")
    print(f"  --no-metrics:                   {z:.2f} req/s {spread(rates_off)}")
    print(f"  ratio on/off {a / z:.3f} (target >= 0.97)")
    print(
        f"RATIOS c8 throughput on/off {a / z:.3f} (target >= 0.97); in-process hop on/off {hop_ratio:.3f} "
        "(target: 1 within noise)"
    )
    print("load:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
