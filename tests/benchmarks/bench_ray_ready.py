"""Start-up under `--launcher ray` against the local launcher: the demo's workers READY, interleaved, medians.

Run by hand (not collected by pytest), from the repository root with the `ray` extra installed:

    PYTHONPATH=$PWD python tests/benchmarks/bench_ray_ready.py [--rounds 5]

The demo model with its vocoder in a process of its own (`--isolate-stage
vocoder`: groups `pipeline` and `vocoder`) is served as an operator does
(`python -m stagevisor serve`), alternately by the local launcher and by
`--launcher ray` on a local two-node Ray cluster (tests/integration/ray_cluster.py),
`pipeline` pinned to one node and `vocoder` to the other, as in docs/guides/ray.md.
Both use one voice-graph cache (STAGEVISOR_CACHE_DIR), as an operator's
persistent cache would be; a first start of each, not counted, fills it.

Each round starts one daemon of each kind (local then Ray, then Ray then
local, ...), one at a time, and reads from its log, for each group, the time
from its `STOPPED -> STARTING` line to its `STARTING -> READY` line (the
daemon's own stamps, the same lines under both launchers: the worker's
launch, its interpreter, imports and stages built, to its READY handshake),
and the daemon's `READY: ... X s after serve started`; then stops it (`stagevisor stop`) and, for Ray, waits until
its actors are gone. Prints each figure's median with its min-max spread,
the ratios of the medians (Ray over local) and the spread of the per-round
ratios. The target: the demo's workers READY under Ray within 1.5x the
local launcher's time, judged on serve's start to every group READY (the
daemon's READY line).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from tests.integration.daemon_helpers import ServeProcess, poll_until  # noqa: E402
from tests.integration.ray_cluster import NODE_A, NODE_B, local_cluster  # noqa: E402

PLACEMENT = ("--model-path", "demo", "--isolate-stage", "vocoder")
GROUPS = ("pipeline", "vocoder")
TARGET = 1.5
LABELS = {
    "daemon": "serve to READY (target)",
    "preload": "fork server preload",
}
"""`daemon`: serve's start to every group READY, what an operator waits for. `preload`: the local launcher loads
the workers' modules once in its fork server before any group is STARTING (Ray has none: 0), so a local group's
STARTING->READY leaves that time out and the two launchers' per-group rows are not like for like."""
STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \[daemon pid \d+\] stagevisor\.daemon: group '(\w+)': "
STARTING = re.compile(STAMP + r"STOPPED -> STARTING", re.M)
READY = re.compile(STAMP + r"STARTING -> READY", re.M)
DAEMON_READY = re.compile(r"READY: \d+ process groups?, ([\d.]+)s after serve started")
PRELOADED = re.compile(r"stagevisor\.daemon: loaded in ([\d.]+)s")


def start_once(args: tuple[str, ...], env: dict[str, str]) -> dict[str, float]:
    """Serve, wait for SERVING, stop; the seconds each group's worker took to READY and the daemon's READY."""
    with ServeProcess(*args, env=env) as daemon:
        daemon.wait_serving(timeout=600)
        log = daemon.log()
        result = daemon.cli("stop")
        if result.returncode != 0:
            raise SystemExit(f"stop failed: {result.stderr}\n{daemon.log()[-3000:]}")
        daemon.wait_exit(timeout=120)
    starting = {group: stamp(text) for text, group in STARTING.findall(log)}
    ready = {group: stamp(text) for text, group in READY.findall(log)}
    figures = {group: ready[group] - starting[group] for group in GROUPS if group in starting and group in ready}
    daemon_ready = DAEMON_READY.search(log)
    if set(figures) != set(GROUPS) or daemon_ready is None:
        raise SystemExit(f"no STARTING and READY lines for {GROUPS} in the daemon log:\n{log[-3000:]}")
    figures["daemon"] = float(daemon_ready.group(1))
    preloaded = PRELOADED.search(log)
    figures["preload"] = float(preloaded.group(1)) if preloaded else 0.0
    return figures


def stamp(text: str) -> float:
    """A log line's time stamp (`2026-12-01 19:26:57,898`, local time) in seconds."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def ratio_text(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return "-"
    return (
        f"{statistics.median(values) * scale:.{digits}f} "
        f"[{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts of each kind, interleaved (default: 5)")
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="svray-graphs"))
    env = {"STAGEVISOR_CACHE_DIR": str(cache)}
    os.environ["STAGEVISOR_CACHE_DIR"] = str(cache)  # the Ray nodes' workers inherit the cluster's environment
    config = cache / "nodes.yaml"
    config.write_text(f"processes:\n  pipeline: {{node: {NODE_A}}}\n  vocoder: {{node: {NODE_B}}}\n")
    gen = local_cluster()
    cluster = next(gen)
    try:
        kinds = {
            "local": PLACEMENT,
            "ray": (*PLACEMENT, "--config", str(config), "--launcher", "ray", "--ray-address", cluster.address),
        }
        first = {kind: start_once(argv, env) for kind, argv in kinds.items()}  # fills the graph cache; not counted
        poll_until(lambda: cluster.stagevisor_actors() == [], timeout=60, message="no stagevisor actor")
        load_before = os.getloadavg()[0]
        samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            order = list(kinds) if round_ % 2 == 0 else list(kinds)[::-1]
            for kind in order:
                samples[kind].append(start_once(kinds[kind], env))
                poll_until(lambda: cluster.stagevisor_actors() == [], timeout=60, message="no stagevisor actor")
            print(f"round {round_ + 1}: " + "; ".join(f"{k} {samples[k][-1]}" for k in kinds), file=sys.stderr)
        load_after = os.getloadavg()[0]
    finally:
        gen.close()
    print(
        f"demo, {' '.join(PLACEMENT)}: {args.rounds} starts per launcher, interleaved; {os.cpu_count()} CPUs, "
        f"1-minute load average {load_before:.1f} before, {load_after:.1f} after"
    )
    print(f"first start (not counted): local {first['local']}, ray {first['ray']}")
    print(f"{'seconds, median [min-max]':<34}{'local':>20}{'ray':>20}{'ratio of medians':>18}{'per-round ratio':>24}")
    for key in ("daemon", "preload", *GROUPS):
        local = [s[key] for s in samples["local"]]
        ray = [s[key] for s in samples["ray"]]
        ratios = [r / lo for r, lo in zip(ray, local, strict=True) if lo]
        label = LABELS.get(key, f"group '{key}' STARTING->READY")
        print(
            f"{label:<34}{spread(local):>20}{spread(ray):>20}"
            f"{ratio_text(statistics.median(ray), statistics.median(local)):>18}{spread(ratios):>24}"
        )
    ratio = statistics.median([s["daemon"] for s in samples["ray"]]) / statistics.median(
        [s["daemon"] for s in samples["local"]]
    )
    print(
        f"the demo's workers READY under Ray in {ratio:.2f}x the local launcher's time (medians): "
        f"{'within' if ratio <= TARGET else 'OVER'} the {TARGET}x target at this load"
    )


if __name__ == "__main__":
    main()
