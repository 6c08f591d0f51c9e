"""`stagevisor bench`: one workload against several topologies of one model, each on a fresh daemon.

For every topology: validate it exactly as `plan` does (an invalid one is
reported with its code and skipped), start `stagevisor serve` on private
sockets, warm up, run the measured workload at each concurrency (or rate),
sample the workers' CPU time and resident memory, and stop the daemon
cleanly, also when the bench is interrupted. Ratios compare every topology
with the first valid one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence, TypeVar

from stagevisor.supervisor import envs
from stagevisor.supervisor.errors import StagevisorError
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.bench.loadgen import (
    GrpcClient,
    NoneSucceeded,
    Outcome,
    Summary,
    VoiceFields,
    closed_loop,
    open_loop,
    stop_if_cancelled,
    summarize,
)

if TYPE_CHECKING:
    from stagevisor.supervisor.security.client import ClientSecurity

T = TypeVar("T")

DEFAULT_TEXTS = (
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "Please confirm your appointment for Tuesday at three thirty in the afternoon.",
    "A supervisor decides where each stage runs; the vocoder may share the engine's process or have its own, "
    "and only a measurement on the real workload says which is faster.",
    "Yes.",
    "Streaming synthesis sends the first audio while the rest of the sentence is still being generated.",
)
"""A mixed default workload: short and long sentences, as a voice assistant sees them."""


@dataclass(frozen=True)
class Topology:
    """One candidate placement: its label as the operator wrote it and the PlacementRequest it stands for."""

    label: str
    request: PlacementRequest


@dataclass
class Workload:
    """What to measure: `requests` per concurrency (or rate), or for `duration` seconds where it is None.

    No defaults for the figures: `stagevisor bench`'s options hold them (commands/bench.py), in one place."""

    texts: Sequence[str]
    requests: int | None
    concurrency: Sequence[int]
    warmup: int
    duration: float | None = None
    rate: float | None = None
    options: dict[str, str] = field(default_factory=dict)
    voice: VoiceFields = field(default_factory=VoiceFields)
    """Who every request speaks as (--voice, --reference-audio, --reference-transcript)."""


REFUSED = frozenset(
    {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "UNIMPLEMENTED", "NOT_FOUND", "FAILED_PRECONDITION"}
)
"""The statuses of a request that cannot succeed as sent (a bad option, no token, a text over the limit): the same
workload is refused again however long it runs."""
REFUSALS_TO_GIVE_UP = 16
"""Refused requests, none succeeded, after which a measured run stops with REQUESTS_FAILED (RefusalWatch): enough to
say the workload is refused, not one request of it, and few enough to say so at once."""

SPREAD_METRICS = ("requests_per_second", "audio_seconds_per_second", "ttfa_p50", "latency_p50")
"""The figures each row gives with their spread over repeats (min and max) and compares against the first topology."""


@dataclass
class Row:
    """One load point of one topology: medians over its repeated runs (one run: that run's figures)."""

    concurrency: int | None
    rate: float | None
    summary: Summary
    resources: dict[str, dict[str, float | None]]
    ratios: dict[str, float | None] = field(default_factory=dict)
    repeats: list[dict[str, Any]] = field(default_factory=list)
    """Each run's SPREAD_METRICS and the machine's 1-minute load average when it started, in run order."""
    within_spread: dict[str, bool] = field(default_factory=dict)
    """Per SPREAD_METRICS figure: True when its min-max range and the first topology's overlap."""

    def spread(self) -> dict[str, list[float] | None]:
        """Min and max of each SPREAD_METRICS figure over the repeats (None where a run had no value)."""
        out: dict[str, list[float] | None] = {}
        for name in SPREAD_METRICS:
            values = [r[name] for r in self.repeats if r.get(name) is not None]
            out[name] = [min(values), max(values)] if values else None
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "rate": self.rate,
            **self.summary.to_json(),
            "resources": self.resources,
            "ratios": self.ratios,
            "spread": self.spread(),
            "within_spread": self.within_spread,
            "repeats": self.repeats,
        }


def figures(summary: Summary) -> dict[str, float | None]:
    """A run's SPREAD_METRICS."""
    return {
        "requests_per_second": summary.requests_per_second,
        "audio_seconds_per_second": summary.audio_seconds_per_second,
        "ttfa_p50": summary.ttfa["p50"],
        "latency_p50": summary.latency["p50"],
    }


def combine(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Rows of repeated runs of one topology (runs[i] = run i's rows, same loads) -> one row per load of medians.

    Medians of each run's figures (percentiles included: the median run's p90, not a p90 over
    pooled requests), errors summed, resources of the median run by requests/s.
    """
    if not runs:
        return []
    combined = []
    for index, first in enumerate(runs[0]):
        rows = [run[index] for run in runs if index < len(run)]
        summaries = [row.summary for row in rows]
        errors: dict[str, int] = {}
        for summary in summaries:
            for code, count in summary.errors.items():
                errors[code] = errors.get(code, 0) + count
        ordered = sorted(rows, key=lambda row: row.summary.requests_per_second)
        median_run = ordered[(len(ordered) - 1) // 2]
        summary = Summary(
            requests=sum(s.requests for s in summaries),
            wall_seconds=sum(s.wall_seconds for s in summaries),
            requests_per_second=_median([s.requests_per_second for s in summaries]) or 0.0,
            audio_seconds_per_second=_median([s.audio_seconds_per_second for s in summaries]) or 0.0,
            ttfa={q: _median([s.ttfa[q] for s in summaries]) for q in first.summary.ttfa},
            latency={q: _median([s.latency[q] for s in summaries]) for q in first.summary.latency},
            real_time_factor=_median([s.real_time_factor for s in summaries]),
            errors=errors,
            stall={q: _median([s.stall.get(q) for s in summaries]) for q in first.summary.stall},
            stalled=_median([s.stalled for s in summaries]),
        )
        repeats = [
            {**figures(row.summary), "load_average_1m": row.repeats[0].get("load_average_1m") if row.repeats else None}
            for row in rows
        ]
        combined.append(Row(first.concurrency, first.rate, summary, median_run.resources, repeats=repeats))
    return combined


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPUs and the load average (1, 5, 15 minutes) right now."""
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


@dataclass
class TopologyResult:
    topology: Topology
    error: dict[str, Any] | None = None
    groups: dict[str, int] = field(default_factory=dict)
    """Process group -> worker pid during the measured run."""
    daemon_pid: int | None = None
    rows: list[Row] = field(default_factory=list)
    digests: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.topology.label,
            "placement": self.topology.request.options(),
            "error": self.error,
            "groups": self.groups,
            "daemon_pid": self.daemon_pid,
            "rows": [r.to_json() for r in self.rows],
        }


def validate(topology: Topology) -> dict[str, Any] | None:
    """None when the topology plans; else the `{"code", "message", ...}` error `plan` would print."""
    try:
        plan_placement(topology.request)
    except StagevisorError as error:
        return error.to_json()["error"]
    return None


class Resources:
    """Samples each worker's resident memory (peak) and CPU seconds over one measured run (psutil)."""

    def __init__(self, pids: dict[str, int]) -> None:
        import psutil

        self.processes = {}
        for group, pid in pids.items():
            try:
                self.processes[group] = psutil.Process(pid)
            except psutil.Error:
                continue
        self.cpu_start = {g: self._cpu(p) for g, p in self.processes.items()}
        self.peak = {g: 0 for g in self.processes}
        self._task: asyncio.Task | None = None

    @staticmethod
    def _cpu(process: Any) -> float | None:
        try:
            times = process.cpu_times()
            return times.user + times.system
        except Exception:  # the worker is gone (restarted): no figure rather than a wrong one
            return None

    def sample(self) -> None:
        for group, process in self.processes.items():
            try:
                self.peak[group] = max(self.peak[group], process.memory_info().rss)
            except Exception:
                pass

    async def _run(self, interval: float) -> None:
        while True:
            self.sample()
            await asyncio.sleep(interval)

    def __enter__(self) -> "Resources":
        self._task = asyncio.get_running_loop().create_task(self._run(0.1))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task:
            self._task.cancel()
        self.sample()

    def figures(self) -> dict[str, dict[str, float | None]]:
        out = {}
        for group, process in self.processes.items():
            start, end = self.cpu_start[group], self._cpu(process)
            out[group] = {
                "cpu_seconds": None if start is None or end is None else round(end - start, 3),
                "peak_rss_bytes": self.peak[group] or None,
                "gpu_memory_bytes": None,
            }
        return out


class Daemon:
    """`stagevisor serve` in a subprocess on private unix sockets, in its own session (Ctrl-C is ours)."""

    def __init__(self, args: Sequence[str], log: Callable[[str], None], python: str | None = None) -> None:
        """`python`: the interpreter that runs it (default this one's; another checkout's venv to compare)."""
        # Unix socket paths are short (about 100 bytes): fall back to /tmp under a long TMPDIR.
        base = tempfile.gettempdir()
        self.tmp = Path(tempfile.mkdtemp(prefix="svbench", dir=base if len(base) < 40 else "/tmp"))
        self.listen = f"unix:{self.tmp / 'public.sock'}"
        self.admin = f"unix:{self.tmp / 'admin.sock'}"
        self.log_path = self.tmp / "daemon.log"
        env = {**os.environ, envs.RUNTIME_DIR.name: str(self.tmp / "run")}
        env.pop("NOTIFY_SOCKET", None)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                # --http none first (a topology's own --http wins): bench speaks gRPC, and the default
                # 127.0.0.1:8000 would collide with any other daemon on the machine.
                [
                    python or sys.executable,
                    "-m",
                    "stagevisor",
                    "serve",
                    "--http",
                    "none",
                    *args,
                    "--listen",
                    self.listen,
                    "--admin-address",
                    self.admin,
                    "--log-level",
                    "WARNING",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._log = log

    async def wait_serving(self, timeout: float = 600.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(self.admin) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                ended = self.ended()
                if ended is not None:
                    raise RuntimeError(ended)
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    stop_if_cancelled()  # a Ctrl-C the call swallowed
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    stop_if_cancelled()
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the daemon was not SERVING within {timeout:g} s")

    def ended(self) -> str | None:
        """None while the daemon runs; else how it ended, then the tail of its log."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"exited with status {code}"
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        return f"the daemon {how}:\n" + self.log_path.read_text(errors="replace")[-2000:]

    async def while_serving(self, work: Awaitable[T], interval: float = 0.2) -> T:
        """`work`'s result; RuntimeError as soon as the daemon ends while it runs (`work` is cancelled then).

        A measurement must not outlive its daemon: its requests would fail at once, one after another, until
        the duration ran out, and the figures of a dead daemon would be reported as measured."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=interval)
                ended = self.ended()
                if ended is not None:
                    raise RuntimeError(f"during the measurement, {ended}")
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def worker_pids(self) -> dict[str, int]:
        import grpc

        from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
        from stagevisor.supervisor.reports import TopologyReport

        async with grpc.aio.insecure_channel(self.admin) as channel:
            message = await admin_pb2_grpc.AdminStub(channel).GetTopology(admin_pb2.GetTopologyRequest(), timeout=10)
        stop_if_cancelled()
        topology = TopologyReport.from_proto(message)
        pids = {group.name: group.pid for group in topology.groups if group.pid}
        pids.update({w.name: w.pid for group in topology.groups for w in group.workers if w.pid})  # replicas
        return pids

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (drain, stop workers), then SIGKILL to the whole session after `timeout`."""
        import shutil

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._log("the daemon did not stop in time; killing it")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


async def measure(
    address: str,
    workload: Workload,
    on_request: Callable[[], None],
    pids: dict[str, int],
    digests: dict[int, str],
    security: ClientSecurity | None = None,
) -> list[Row]:
    """The workload's rows against the daemon at `address`, dialled with `security` (default plaintext).

    Raises a RunFailed at the first run it cannot give figures for: Unreachable (the daemon stopped answering) or
    NoneSucceeded (every request of a run failed)."""
    client = GrpcClient(address, workload.options, security=security, voice=workload.voice)
    rows = []
    try:
        for _ in range(workload.warmup):
            await client.request(0, workload.texts[0])
            on_request()
        runs = [(None, workload.rate)] if workload.rate else [(c, None) for c in workload.concurrency]
        for concurrency, rate in runs:
            load = os.getloadavg()[0]
            where = f"c{concurrency}" if concurrency else f"{rate:g}/s"
            request = RefusalWatch(client.request, where).request
            with Resources(pids) as resources:
                if rate:
                    outcomes, wall = await open_loop(
                        request,
                        workload.texts,
                        rate,
                        requests=workload.requests,
                        duration=workload.duration,
                        progress=lambda n: on_request(),
                    )
                else:
                    outcomes, wall = await closed_loop(
                        request,
                        workload.texts,
                        concurrency or 1,
                        requests=workload.requests,
                        duration=workload.duration,
                        progress=lambda n: on_request(),
                    )
            if outcomes and all(o.error is not None for o in outcomes):
                raise NoneSucceeded(none_succeeded(outcomes, where))
            record_digests(outcomes, digests)
            summary = summarize(outcomes, wall)
            run = {**figures(summary), "load_average_1m": round(load, 2)}
            rows.append(Row(concurrency, rate, summary, resources.figures(), repeats=[run]))
    finally:
        await client.close()
    return rows


class RefusalWatch:
    """Ends a measured run with NoneSucceeded once REFUSALS_TO_GIVE_UP of its requests were refused and none has
    succeeded: each further request would be refused too, and a --duration run would go on sending them to its end.

    Only refusals count (REFUSED): a daemon that is busy (RESOURCE_EXHAUSTED), starting (UNAVAILABLE) or failing
    now and then (INTERNAL) may still serve the requests that follow, and a run that measures them is a run."""

    def __init__(self, request: Callable[[int, str], Awaitable[Outcome]], load: str) -> None:
        self._request = request
        self._load = load
        self._refused: list[Outcome] = []
        self._succeeded = False

    async def request(self, index: int, text: str) -> Outcome:
        outcome = await self._request(index, text)
        if outcome.error is None:
            self._succeeded = True
        elif outcome.error in REFUSED and not self._succeeded:
            self._refused.append(outcome)
            if len(self._refused) >= REFUSALS_TO_GIVE_UP:
                raise NoneSucceeded(
                    f"{none_succeeded(self._refused, self._load)}; the run stopped after {len(self._refused)} "
                    "refusals: the requests that follow would be refused too"
                )
        return outcome


def none_succeeded(outcomes: Sequence[Outcome], load: str) -> str:
    """What failed in a run without one successful request: the count per status code and the first one's message."""
    codes = ", ".join(f"{count} {code}" for code, count in Counter(o.error for o in outcomes).items())
    first = outcomes[0]
    return f"no request succeeded at {load} ({codes}); the first failed {first.error}: {first.detail}"


def record_digests(outcomes: Sequence[Outcome], digests: dict[int, str]) -> None:
    for outcome in outcomes:
        if outcome.error is None:
            digests.setdefault(outcome.text_index, outcome.digest)


def add_ratios(results: Sequence[TopologyResult]) -> None:
    """Each row's ratios against the first valid topology's row at the same concurrency (or rate)."""
    valid = [r for r in results if r.error is None and r.rows]
    if not valid:
        return
    base = {(row.concurrency, row.rate): row.summary for row in valid[0].rows}
    base_rows = {(row.concurrency, row.rate): row for row in valid[0].rows}
    for result in valid:
        for row in result.rows:
            b = base.get((row.concurrency, row.rate))
            if b is None:
                continue
            s = row.summary
            row.ratios = {
                "requests_per_second": _ratio(s.requests_per_second, b.requests_per_second),
                "audio_seconds_per_second": _ratio(s.audio_seconds_per_second, b.audio_seconds_per_second),
                "ttfa_p50": _ratio(s.ttfa["p50"], b.ttfa["p50"]),
                "ttfa_p50_delta_seconds": None
                if s.ttfa["p50"] is None or b.ttfa["p50"] is None
                else s.ttfa["p50"] - b.ttfa["p50"],
                "latency_p50": _ratio(s.latency["p50"], b.latency["p50"]),
            }
            if (
                result is not valid[0]
                and len(row.repeats) > 1
                and len(base_rows[(row.concurrency, row.rate)].repeats) > 1
            ):
                mine, theirs = row.spread(), base_rows[(row.concurrency, row.rate)].spread()
                row.within_spread = {
                    name: _overlap(mine[name], theirs[name])
                    for name in SPREAD_METRICS
                    if mine[name] is not None and theirs[name] is not None
                }


def _overlap(a: list[float] | None, b: list[float] | None) -> bool:
    """Whether two [min, max] ranges share a value: the difference of their medians is within the spread."""
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def _load(row: Row) -> str:
    return f"c{row.concurrency}" if row.concurrency else f"{row.rate:g} req/s"


def failures(result: TopologyResult) -> str | None:
    """`N of M requests failed (K CODE at LOAD, ...)` over a topology's rows, or None when every request succeeded.

    Failed requests are left out of its figures (loadgen.summarize): a run that mostly failed can read fast."""
    failed = [(count, code, _load(row)) for row in result.rows for code, count in row.summary.errors.items() if count]
    if not failed:
        return None
    total = sum(row.summary.requests for row in result.rows)
    where = ", ".join(f"{count} {code} at {load}" for count, code, load in failed)
    return f"{sum(count for count, _, _ in failed)} of {total} requests failed ({where})"


def verdict(results: Sequence[TopologyResult]) -> list[str]:
    """The answer in words: each topology's failed requests, each topology against the first, then the best for
    throughput and for latency among the topologies none of whose requests failed."""
    valid = [r for r in results if r.error is None and r.rows]
    if not valid:
        return ["no topology could be measured"]
    failed = {id(r): failures(r) for r in valid}
    lines = [
        f"`{r.topology.label}`: {failed[id(r)]}; its figures are of the requests that succeeded"
        for r in valid
        if failed[id(r)]
    ]
    first = valid[0]
    for result in valid[1:]:
        top, low = result.rows[-1], result.rows[0]
        where_top, where_low = _load(top), _load(low)
        rps = top.ratios.get("requests_per_second")
        delta = low.ratios.get("ttfa_p50_delta_seconds")
        parts = []
        noise = f" (within the spread of {len(top.repeats)} runs: not a measured difference)"
        if rps is not None:
            parts.append(
                f"{rps:.2f}x requests/s at {where_top}"
                + (noise if top.within_spread.get("requests_per_second") else "")
            )
        if delta is not None:
            parts.append(
                f"{delta * 1000:+.1f} ms median time to first audio at {where_low}"
                + (noise if low.within_spread.get("ttfa_p50") else "")
            )
        lines.append(f"`{result.topology.label}` against `{first.topology.label}`: " + ", ".join(parts))
    lines.extend(_best([r for r in valid if not failed[id(r)]], [r.topology.label for r in valid if failed[id(r)]]))
    if max(len(row.repeats) for r in valid for row in r.rows) <= 1 and len(valid) > 1:
        lines.append(
            "one run per point, so no spread was measured: runs on one machine differ by 10% or more; "
            "--repeats 3 or more says whether a difference is larger than that"
        )
    return lines


def _best(clean: Sequence[TopologyResult], failed: Sequence[str]) -> list[str]:
    """The "best for" lines among `clean`, the topologies none of whose requests failed; `failed` labels the others,
    left out: their figures are of the requests that succeeded, which says nothing of what they serve."""
    if not clean:
        return ["no best topology named: requests failed on every topology (above); rerun once they succeed"]
    lines = []
    best_rps = max(clean, key=lambda r: r.rows[-1].summary.requests_per_second)
    with_ttfa = [r for r in clean if r.rows[0].summary.ttfa["p50"] is not None]
    lines.append(
        f"best for throughput: `{best_rps.topology.label}` "
        f"({best_rps.rows[-1].summary.requests_per_second:.2f} requests/s at the highest load"
        + _not_separated(best_rps, clean, -1, "requests_per_second")
        + ")"
    )
    if with_ttfa:
        best = min(with_ttfa, key=lambda r: r.rows[0].summary.ttfa["p50"] or 0.0)  # none is None here
        best_ttfa = best.rows[0].summary.ttfa["p50"] or 0.0
        lines.append(
            f"best for latency: `{best.topology.label}` "
            f"({best_ttfa * 1000:.1f} ms median time to first audio at the lowest load"
            + _not_separated(best, with_ttfa, 0, "ttfa_p50")
            + ")"
        )
    if failed:
        labels = ", ".join(f"`{label}`" for label in failed)
        verb, it = ("is", "it") if len(failed) == 1 else ("are", "them")
        lines.append(f"{labels} {verb} left out of best: requests failed on {it} (above)")
    return lines


def _not_separated(best: TopologyResult, others: Sequence[TopologyResult], index: int, name: str) -> str:
    """`; within the spread of ...` when `best`'s min-max range of `name` on row `index` overlaps another
    topology's at the same load: then "best" is the larger median, not a measured difference."""
    mine = best.rows[index]
    if len(mine.repeats) < 2:
        return ""
    tied = [
        other.topology.label
        for other in others
        if other is not best
        and len(other.rows[index].repeats) > 1
        and (other.rows[index].concurrency, other.rows[index].rate) == (mine.concurrency, mine.rate)
        and _overlap(mine.spread()[name], other.rows[index].spread()[name])
    ]
    if not tied:
        return ""
    return "; within the spread of " + ", ".join(f"`{label}`" for label in tied) + ": not a measured difference"


def identical(results: Sequence[TopologyResult]) -> dict[str, Any]:
    """Whether every topology produced the same audio for each text (first successful request of each)."""
    valid = [r for r in results if r.error is None and r.digests]
    differing = []
    if valid:
        for index, digest in valid[0].digests.items():
            for other in valid[1:]:
                if index in other.digests and other.digests[index] != digest:
                    differing.append({"text_index": index, "topology": other.topology.label})
    return {"identical": not differing, "differing": differing}
