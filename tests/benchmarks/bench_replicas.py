"""Replicas of a GIL-bound stage: requests/s with `--process-replicas front=2` against 1, in the same run.

Run by hand (not collected by pytest), from the repository root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_replicas.py [--iterations 3000000] [--seconds 20]

The pipeline (written to a temporary directory with its executors, served
with `stagevisor serve --config`): `burn`, in process `front`, spins a pure
Python loop for a fixed number of iterations per request (it holds the GIL
the whole time, so one process serves one request at a time on one core);
`beep`, in process `tail`, streams 10 ms of silence to the client. Two
daemons run one after the other: `front` with 1 replica, then with 2. Each
gets the same closed-loop load (--clients concurrent gRPC requests for
--seconds after a warm-up) and the script prints requests/s of both, their
ratio (target >= 1.7 on 2 cores) and the machine's load average from
`uptime` before and after, since a shared machine skews every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import grpc  # noqa: E402

from daemon_helpers import ServeProcess  # noqa: E402
from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc  # noqa: E402

STAGES = '''\
"""Benchmark executors: a pure-Python CPU burner and a tiny terminal stage."""


class Burn:
    def __init__(self, iterations):
        self.iterations = iterations

    async def process(self, payload, ctx):
        x = 1
        for i in range(self.iterations):  # pure Python: holds the GIL throughout
            x = (x * 31 + i) % 1000003
        return {"burned": x}


class Beep:
    async def process(self, payload, ctx):
        await ctx.stream({"audio": [0.0] * 160, "sample_rate": 16000})
        return {}


def burn(iterations=400000):
    return Burn(int(iterations))


def beep():
    return Beep()
'''

CONFIG = """\
pipeline:
  name: replica-bench
  stages:
    - name: burn
      factory: replica_bench_stages:burn
      args: {{iterations: {iterations}}}
      process: front
      next: [beep]
    - name: beep
      factory: replica_bench_stages:beep
      process: tail
  process_safe_edges: [[burn, beep]]
"""


async def load(address: str, clients: int, seconds: float, warmup: float) -> tuple[int, int, float]:
    """(completed, failed, seconds measured): `clients` loops of back-to-back requests."""
    done = failed = 0
    measuring = False
    stop = False

    async def client(stub) -> None:
        nonlocal done, failed
        while not stop:
            try:
                async for _ in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text="burn"), timeout=120):
                    pass
                if measuring:
                    done += 1
            except grpc.aio.AioRpcError:
                if measuring:
                    failed += 1

    async with grpc.aio.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        tasks = [asyncio.create_task(client(stub)) for _ in range(clients)]
        await asyncio.sleep(warmup)
        measuring, started = True, time.perf_counter()
        await asyncio.sleep(seconds)
        measuring, elapsed = False, time.perf_counter() - started
        stop = True
        await asyncio.gather(*tasks)
    return done, failed, elapsed


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=3_000_000, help="loop iterations per request in `burn`")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured time per daemon")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=4, help="concurrent requests")
    args = parser.parse_args()
    print(f"before: {uptime()}", flush=True)
    rates = {}
    with tempfile.TemporaryDirectory(prefix="svbench") as tmp:
        (Path(tmp) / "replica_bench_stages.py").write_text(STAGES)
        config = Path(tmp) / "replica-bench.yaml"
        config.write_text(CONFIG.format(iterations=args.iterations))
        for replicas in (1, 2):
            with ServeProcess("--config", str(config), "--process-replicas", f"front={replicas}") as daemon:
                daemon.wait_serving(timeout=300)
                done, failed, elapsed = asyncio.run(load(daemon.listen, args.clients, args.seconds, args.warmup))
            rates[replicas] = done / elapsed
            print(
                f"front x{replicas}: {done} requests in {elapsed:.1f}s = {rates[replicas]:.2f} req/s ({failed} failed)",
                flush=True,
            )
    print(f"after: {uptime()}")
    ratio = rates[2] / rates[1] if rates[1] else float("nan")
    print(f"ratio replicas 2 / 1: {ratio:.2f}x (target >= 1.7x on 2 idle cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
