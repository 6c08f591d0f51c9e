"""Autoscaling under a load step: the timeline of replicas and first audio, against a fixed single replica.

Run by hand (not collected by pytest), from the repository root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_autoscale.py [--low 1 --high 8] [--phase 30]

Two daemons serve the demo with its vocoder isolated, one after the other:
`fixed` keeps one vocoder; `autoscaled` lets it scale between 1 and 3
replicas on first audio and requests per replica. Each gets the same load:
--low clients for --phase seconds, --high clients for twice that, then
--low again. Every second the script prints the vocoder's replicas, the
requests finished in that second and their median and p90 first audio (as
the clients measured them), so the timeline shows when replicas were added
and removed. At the end: first audio p50/p90 and requests/s during the high
phase, autoscaled against fixed (ratios), and the load average before and
after, since a shared machine skews every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "integration")]

import grpc  # noqa: E402

from daemon_helpers import NOISELESS, ServeProcess  # noqa: E402
from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, then rests in the warm afternoon sun."
AUTOSCALE = """\
model_path: demo
processes:
  vocoder:
    autoscale:
      min_replicas: 1
      max_replicas: 3
      target_first_audio_p90_seconds: {target}
      max_in_flight_per_replica: 2
      scale_up_cooldown_seconds: 3
      scale_down_cooldown_seconds: 10
      window_seconds: 5
"""


class Load:
    """A variable number of closed-loop clients; each finished request is (finish time, first audio seconds)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.done: list[tuple[float, float]] = []
        self.failed = 0
        self.lock = threading.Lock()
        self.stops: list[threading.Event] = []
        self.threads: list[threading.Thread] = []

    def set_clients(self, n: int) -> None:
        while len(self.stops) > n:
            self.stops.pop().set()
        while len(self.stops) < n:
            stop = threading.Event()
            thread = threading.Thread(target=self._client, args=(stop,), daemon=True)
            self.stops.append(stop)
            self.threads.append(thread)
            thread.start()

    def _client(self, stop: threading.Event) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            while not stop.is_set():
                started = time.monotonic()
                first = None
                try:
                    request = synthesis_pb2.SynthesizeRequest(text=TEXT, options=NOISELESS)
                    for chunk in stub.Synthesize(request, timeout=120):
                        if first is None and chunk.pcm:
                            first = time.monotonic() - started
                    with self.lock:
                        self.done.append((time.monotonic(), first or 0.0))
                except grpc.RpcError:
                    with self.lock:
                        self.failed += 1

    def close(self) -> None:
        self.set_clients(0)
        for thread in self.threads:
            thread.join(timeout=150)


def replicas(daemon: ServeProcess) -> int:
    group = next(g for g in daemon.admin_topology()["groups"] if g["name"] == "vocoder")
    return max(1, group.get("replicas") or 1)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(label: str, argv: list[str], schedule: list[tuple[int, float]]) -> dict[str, float]:
    with ServeProcess(*argv) as daemon:
        daemon.wait_serving(timeout=300)
        load = Load(daemon.listen)
        started = time.monotonic()
        high_window = (0.0, 0.0)
        print(f"\n[{label}]   t(s)  clients  replicas  done  first audio p50 / p90 (ms)")
        try:
            elapsed = 0.0
            for clients, seconds in schedule:
                load.set_clients(clients)
                phase_start = time.monotonic()
                if clients == max(c for c, _ in schedule):
                    high_window = (phase_start, phase_start + seconds)
                while time.monotonic() - phase_start < seconds:
                    time.sleep(1.0)
                    now = time.monotonic()
                    with load.lock:
                        last = [first for when, first in load.done if now - 1.0 < when <= now]
                    elapsed = now - started
                    figures = f"{quantile(last, 0.5) * 1000:6.0f} / {quantile(last, 0.9) * 1000:6.0f}" if last else ""
                    print(f"[{label}] {elapsed:6.0f}  {clients:7d}  {replicas(daemon):8d}  {len(last):4d}  {figures}")
        finally:
            load.close()
    in_high = [first for when, first in load.done if high_window[0] + 5 < when <= high_window[1]]
    span = max(1e-9, high_window[1] - high_window[0] - 5)
    return {
        "p50": quantile(in_high, 0.5),
        "p90": quantile(in_high, 0.9),
        "rps": len(in_high) / span,
        "failed": float(load.failed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=8)
    parser.add_argument("--phase", type=float, default=30.0, help="seconds of the low phases (the high one is 2x)")
    parser.add_argument("--target", type=float, default=0.5, help="first audio p90 target, seconds")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved fixed/autoscaled pairs")
    args = parser.parse_args()
    schedule = [(args.low, args.phase), (args.high, 2 * args.phase), (args.low, args.phase)]
    print("load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"cores: {os.cpu_count()}")
    runs: dict[str, list[dict[str, float]]] = {"fixed": [], "autoscaled": []}
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "autoscale.yaml"
        config.write_text(AUTOSCALE.format(target=args.target))
        for _ in range(args.repeats):
            runs["fixed"].append(run("fixed", ["--model-path", "demo", "--isolate-stage", "vocoder"], schedule))
            argv = ["--config", str(config), "--isolate-stage", "vocoder"]
            runs["autoscaled"].append(run("autoscaled", argv, schedule))
    print("load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"\nhigh phase ({args.high} clients, after its first 5 s), medians of {args.repeats} interleaved runs")
    print("(min-max in brackets): autoscaled / fixed")
    for key, unit in (("p50", "first audio p50 (s)"), ("p90", "first audio p90 (s)"), ("rps", "requests/s")):
        scaled = [r[key] for r in runs["autoscaled"]]
        fixed = [r[key] for r in runs["fixed"]]
        ratio = statistics.median(scaled) / statistics.median(fixed)
        print(
            f"  {unit:22s} {statistics.median(scaled):7.3f} [{min(scaled):.3f}-{max(scaled):.3f}] / "
            f"{statistics.median(fixed):7.3f} [{min(fixed):.3f}-{max(fixed):.3f}] = {ratio:.2f}x"
        )
    failed = {label: sum(r["failed"] for r in results) for label, results in runs.items()}
    print(f"  failed requests: autoscaled {failed['autoscaled']:.0f}, fixed {failed['fixed']:.0f}")


if __name__ == "__main__":
    main()
