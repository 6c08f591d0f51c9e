"""DaemonMetrics: every `stagevisor_` metric of one daemon, in its own Prometheus registry.

Request metrics (latency, time to first audio, real-time factor, chunk gaps)
are measured in the daemon with the client library's own types. Stage and edge
metrics come from the workers as deltas (MetricsReport frames on the data
plane) and are accumulated here, so they survive worker restarts; a custom
collector exports them, with the process groups' states and measured resources.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS, RTF_BOUNDS, quantile
from stagevisor.supervisor.metrics.timings import request_timings
from stagevisor.supervisor.metrics.recent import RecentRequests
from stagevisor.supervisor.metrics.playback import Playback

log = logging.getLogger("stagevisor.metrics")

WINDOW_SECONDS = 60.0
"""`stagevisor top` shows stage quantiles over this window."""
GROUP_STATES = ("STOPPED", "STARTING", "READY", "BACKOFF", "STOPPING", "FAILED")
_LE = [f"{b:g}" for b in LATENCY_BOUNDS] + ["+Inf"]


def _cumulative(counts: list[int]) -> list[tuple[str, int]]:
    out, total = [], 0
    for le, count in zip(_LE, counts, strict=True):
        total += count
        out.append((le, total))
    return out


def _add(into: list[int], counts: Iterable[int]) -> None:
    for index, count in enumerate(counts):
        into[index] += count


@dataclass
class _SeriesTotals:
    """A stage's finished and failed calls and timed-call histogram, cumulative: over all its groups (a stage's own
    totals), or in one group (the series `{stage, group}`: an apply that moves the stage starts its new group's)."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    count: int = 0
    sum: float = 0.0
    calls: int = 0
    failures: int = 0

    def add(self, item: Any) -> None:
        """Add one stage item of a worker's MetricsReport (deltas)."""
        self.calls += item.calls
        if item.count:
            _add(self.buckets, item.buckets)
            self.count += item.count
            self.sum += item.sum
        self.failures += item.failures


@dataclass
class _StageTotals(_SeriesTotals):
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Reporting worker's name (its group, or a replica's own name) -> (pid, calls running) as last reported."""
    history: deque[tuple[float, list[int], int]] = field(default_factory=deque)
    """(monotonic time, cumulative buckets, cumulative calls) after each report, trimmed to the window."""


@dataclass
class _EdgeTotals:
    handoffs: int = 0
    chunks: int = 0
    bytes: int = 0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    latency_count: int = 0
    latency_sum: float = 0.0


class MeteredRequest(Protocol):
    """What a meter reads of the admitted request (the data plane's RequestHandle): its id and stage timings."""

    request_id: str

    @property
    def timings(self) -> Sequence[tuple[str, float, float]]:
        """(name, start, end) of each finished branch's trace, as the terminal stages reported them."""


class RequestMeter:
    """One synthesis request as the daemon sees it: `attach()` its handle once admitted, call `audio()`
    per chunk, then `finish()` once; with OTLP configured, finishing exports the request's spans."""

    __slots__ = (
        "_metrics",
        "started",
        "first_audio",
        "_last_chunk",
        "_samples",
        "_rate",
        "_finished",
        "_handle",
        "_timings",
        "_playback",
    )

    def __init__(self, metrics: "DaemonMetrics") -> None:
        self._metrics = metrics
        self.started = time.monotonic()
        self.first_audio: float | None = None
        self._last_chunk = 0.0
        self._samples = 0
        self._rate = 0
        self._finished = False
        self._handle: MeteredRequest | None = None
        self._timings: Any = None
        self._playback = Playback()

    @property
    def exports_spans(self) -> bool:
        """True when the request's spans go out over OTLP (its payload must then ask for timings)."""
        return self._metrics.spans is not None

    def attach(self, handle: MeteredRequest) -> None:
        """The admitted request (its `request_id`, and the `timings` its terminal stages report); from now
        on, until `finish()`, it counts in flight (not while it waits in the queue or is refused)."""
        if self._handle is None and not self._finished:
            self._metrics._in_flight.inc()
        self._handle = handle

    def timings(self) -> Any:
        """The request's RequestTimings, taken once (the first call marks the request's end)."""
        if self._timings is None:
            handle = self._handle
            self._timings = request_timings(
                handle.timings if handle is not None else (),
                self.started,
                time.monotonic(),
                self.first_audio,
                self._metrics.stage_groups,
            )
        return self._timings

    def audio(self, samples: int, sample_rate: int) -> None:
        now = time.monotonic()
        if self.first_audio is None:
            self.first_audio = now - self.started
        else:
            self._metrics._gap.observe(now - self._last_chunk)
        self._last_chunk = now
        self._samples += samples
        self._rate = sample_rate
        if sample_rate:
            self._playback.arrived(now, samples / sample_rate)

    def finish(self, code: str) -> None:
        """`code` is the grpc status name the client got ("OK", "INTERNAL", ...)."""
        if self._finished:
            return
        self._finished = True
        metrics = self._metrics
        elapsed = time.monotonic() - self.started
        if self._handle is not None:
            metrics._in_flight.dec()
        outcome = "success" if code == "OK" else ("cancelled" if code == "CANCELLED" else "error")
        metrics.requests.labels(metrics.model, outcome, code).inc()
        if code == "OK":
            metrics._latency.observe(elapsed)
            if self.first_audio is not None:
                metrics._ttfa.observe(self.first_audio)
                metrics.recent.add(time.monotonic(), self.first_audio, self._playback.stall)
            if self._samples and self._rate:
                audio_seconds = self._samples / self._rate
                metrics._audio.inc(audio_seconds)
                metrics._rtf.observe(elapsed / audio_seconds)
                metrics._stall.observe(self._playback.stall)
        if metrics.spans is not None:
            try:
                metrics.spans.export(
                    self.timings(),
                    self.started,
                    metrics.model,
                    code,
                    self._handle.request_id if self._handle is not None else "",
                )
            except Exception:  # noqa: BLE001 - exporting spans must never fail a request
                log.warning("could not export the spans of a request", exc_info=True)


class DaemonMetrics:
    """The metrics of one daemon. `groups` tells the collector each group's state and resources, once per scrape
    (rows marked `retired` carry only the restart count of a runner retired since the last scrape)."""

    def __init__(
        self,
        model: str | None,
        stage_groups: dict[str, str],
        groups: Callable[[], list[dict[str, Any]]] = list,
        gpus: Callable[[], list[dict[str, Any]]] = list,
        clock: Callable[[], float] = time.monotonic,
        spans: Any = None,
    ) -> None:
        self.model = model or "custom"
        self.spans = spans
        """A SpanExporter when OTLP export is configured (SpanExporter.from_env()), else None."""
        self.stage_groups = dict(stage_groups)
        self.groups = groups
        self.gpus = gpus
        self.clock = clock
        # `_created` series (counter start times) only double the series count for dashboards
        # nobody builds on them; the client library switches them off process-wide.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "stagevisor_requests",
            "Synthesis requests by outcome (success, error, cancelled) and the gRPC status code the client got.",
            ["model", "outcome", "code"],
            registry=r,
        )
        self.in_flight = Gauge(
            "stagevisor_requests_in_flight", "Requests admitted and not finished.", ["model"], registry=r
        )
        self.latency = Histogram(
            "stagevisor_request_duration_seconds",
            "End-to-end latency of successful requests, from arrival (time queued included) to the last audio chunk.",
            ["model"],
            buckets=LATENCY_BOUNDS,
            registry=r,
        )
        self.ttfa = Histogram(
            "stagevisor_time_to_first_audio_seconds",
            "From arrival (time queued included) to the first audio chunk leaving the daemon, of successful requests.",
            ["model"],
            buckets=LATENCY_BOUNDS,
            registry=r,
        )
        self.rtf = Histogram(
            "stagevisor_real_time_factor",
            "Synthesis time divided by the duration of the audio produced (below 1: faster than real time).",
            ["model"],
            buckets=RTF_BOUNDS,
            registry=r,
        )
        self.gap = Histogram(
            "stagevisor_audio_chunk_gap_seconds",
            "Time between consecutive audio chunks of "
            "one request (a gap longer than the chunk's audio is an audible stall).",
            ["model"],
            buckets=LATENCY_BOUNDS,
            registry=r,
        )
        self.stall = Histogram(
            "stagevisor_playback_stall_seconds",
            "How long a client playing a successful "
            "request's audio from its first chunk would have paused waiting for audio (0: the "
            "stream stayed ahead of real time).",
            ["model"],
            buckets=(0.0, *LATENCY_BOUNDS),
            registry=r,
        )
        self.audio = Counter("stagevisor_audio_seconds", "Seconds of audio delivered.", ["model"], registry=r)
        self.autoscale_decisions = Counter(
            "stagevisor_autoscale_decisions",
            "Autoscaling decisions per process group: up, down, or refused (a scale the GPU rules or a failed "
            "worker start turned down; the count stayed).",
            ["group", "direction"],
            registry=r,
        )
        self.applies = Counter(
            "stagevisor_topology_applies",
            "Live topology changes (`stagevisor apply`) by outcome: applied, or refused (nothing changed).",
            ["outcome"],
            registry=r,
        )
        self.recent = RecentRequests()
        """First audio and stall of the recent successful requests: the autoscaler's p90s."""
        self.budget_warnings = Counter(
            "stagevisor_group_budget_warnings",
            "Times a process group went over its memory budget.",
            ["group"],
            registry=r,
        )
        # Label children bound once: the request path does no label lookups.
        m = self.model
        self._in_flight, self._latency, self._ttfa = (
            self.in_flight.labels(m),
            self.latency.labels(m),
            self.ttfa.labels(m),
        )
        self._rtf, self._gap, self._audio = self.rtf.labels(m), self.gap.labels(m), self.audio.labels(m)
        self._stall = self.stall.labels(m)
        for group in dict.fromkeys(self.stage_groups.values()):
            self.budget_warnings.labels(group)
        self.stages: dict[str, _StageTotals] = {}
        """Stage -> its totals over every group that ran it (the windows of `top` and the autoscaler, in flight)."""
        self.series: dict[tuple[str, str], _SeriesTotals] = {}
        """(stage, group that ran it) -> its totals there: the stage series' counts, kept after an apply moves it."""
        self.edges: dict[tuple[str, str, str], _EdgeTotals] = {}
        self.registry.register(_WorkerCollector(self))

    # ---- requests -------------------------------------------------------------------

    def start_request(self) -> RequestMeter:
        return RequestMeter(self)

    admission: Any = None
    """The gateway's Admission (queued, rejected by reason), read at scrape time; set by the daemon."""

    def close(self) -> None:
        """Flush and stop the span exporter, if any (blocks up to its export timeout)."""
        if self.spans is not None:
            self.spans.shutdown()

    # ---- worker reports ---------------------------------------------------------------

    def apply_report(self, report: Any) -> None:
        """Add one worker's MetricsReport (deltas) to the totals."""
        now = self.clock()
        group = report.group.partition("/")[0]  # a replica `group/i` reports by its own name
        for item in report.stages:
            totals = self.stages.get(item.stage)
            if totals is None:
                totals = self.stages[item.stage] = _StageTotals()
            totals.add(item)
            series = self.series.get((item.stage, group))
            if series is None:
                series = self.series[item.stage, group] = _SeriesTotals()
            series.add(item)
            if item.count or item.calls:
                totals.history.append((now, list(totals.buckets), totals.calls))
                while len(totals.history) > 2 and totals.history[1][0] <= now - WINDOW_SECONDS:
                    totals.history.popleft()
            totals.in_flight[report.group] = (report.pid, item.in_flight)
        for item in report.edges:
            key = (item.src, item.dst, item.transport)
            edge_totals = self.edges.get(key)
            if edge_totals is None:
                edge_totals = self.edges[key] = _EdgeTotals()
            edge_totals.handoffs += item.handoffs
            edge_totals.chunks += item.chunks
            edge_totals.bytes += item.bytes
            if item.latency_count:
                _add(edge_totals.latency_buckets, item.latency_buckets)
                edge_totals.latency_count += item.latency_count
                edge_totals.latency_sum += item.latency_sum

    def stage_in_flight(self, stage: str, pids: dict[str, int]) -> int:
        """In-flight calls of a stage, as last reported by the workers running now (`pids`: worker name -> pid);
        what a worker that has since exited or been replaced reported does not count. A worker is known by its
        pid: one a scale renamed (`pipeline` is `pipeline/0` once the group has replicas) reports under the name
        it started with."""
        totals = self.stages.get(stage)
        if totals is None:
            return 0
        running = set(pids.values())
        return sum(count for pid, count in totals.in_flight.values() if pid and pid in running)

    def worker_in_flight(self, worker: str, pid: int) -> int:
        """Stage calls running now in one worker (a group, or a replica `group/i`), as the process `pid` last
        reported, under whatever name it reported (a scale may have renamed it since); 0 for no pid."""
        return sum(
            count
            for totals in self.stages.values()
            for reported, count in totals.in_flight.values()
            if pid and reported == pid
        )

    def stage_window(self, stage: str) -> tuple[int, float | None, float | None]:
        """(calls, p50, p99) of a stage over the last WINDOW_SECONDS: every finished call, and the quantiles
        of its timed calls."""
        totals = self.stages.get(stage)
        if totals is None or not totals.history:
            return 0, None, None
        now = self.clock()
        if totals.history[-1][0] <= now - WINDOW_SECONDS:
            return 0, None, None
        base, base_calls = [0] * len(totals.buckets), 0
        for when, snapshot, calls in totals.history:
            if when > now - WINDOW_SECONDS:
                break
            base, base_calls = snapshot, calls
        counts = [c - b for c, b in zip(totals.buckets, base, strict=True)]
        return totals.calls - base_calls, quantile(0.5, counts), quantile(0.99, counts)


class _RestartTotals:
    """stagevisor_group_restarts_total per worker, from restart counts that start again at 0 whenever an apply or a
    scale gives a worker a new runner.

    A group row names its count (`restart_count_id`: a new runner's is new, one that follows its predecessor
    goes on with the predecessor's). Each scrape adds to the worker's total what its count grew by since the
    count was last seen (a count never seen: from 0), so every restart is added once whichever scrape first
    sees it, a worker renamed by a scale (`vocoder` -> `vocoder/0`) brings no restart twice, and no total goes
    down within the daemon's life; a runner retired since the last scrape comes once more as a `retired` row, so
    its last restarts count for the name it had. A row without an id is read as one count per worker name.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, object], float] = {}
        """A count (by id) -> its value at the last scrape."""
        self._totals: dict[str, float] = {}

    def total(self, row: dict[str, Any]) -> float:
        """The worker's total with what the row's count grew by added."""
        worker, count, key = row["name"], row.get("restarts", 0), self._count_of(row)
        grown = count - self._seen.get(key, 0)
        self._seen[key] = count
        self._totals[worker] = self._totals.get(worker, 0) + max(grown, 0)
        return self._totals[worker]

    def forget_others(self, rows: Iterable[dict[str, Any]]) -> None:
        """Drop the counts of runners no longer in `rows` (an apply's or a scale's retired ones): no id comes back."""
        current = {self._count_of(row) for row in rows}
        for key in [key for key in self._seen if key[0] == "count" and key not in current]:
            del self._seen[key]

    @staticmethod
    def _count_of(row: dict[str, Any]) -> tuple[str, object]:
        return ("count", row["restart_count_id"]) if "restart_count_id" in row else ("worker", row["name"])


class _WorkerCollector:
    """Exports worker-reported totals and group resources as metric families at scrape time."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.m = metrics
        self._restarts = _RestartTotals()

    def describe(self) -> list[Any]:
        return []  # generated at scrape time; nothing to check for duplicates up front

    def collect(self) -> Iterable[Any]:
        m = self.m
        rows = m.groups()
        for row in rows:
            if row.get("retired"):
                self._restarts.total(row)  # a runner retired since the last scrape: its last restarts count
        groups = [row for row in rows if not row.get("retired")]
        pids = {g["name"]: g.get("pid") or 0 for g in groups}
        processing = HistogramMetricFamily(
            "stagevisor_stage_processing_seconds",
            "Time a stage's process() took per timed call (every call up to "
            "1000 requests/s per worker, an even sample above).",
            labels=["stage", "group"],
        )
        calls = CounterMetricFamily(
            "stagevisor_stage_calls", "Calls of a stage that finished (every call).", labels=["stage", "group"]
        )
        in_flight = GaugeMetricFamily(
            "stagevisor_stage_in_flight", "Calls of a stage running now.", labels=["stage", "group"]
        )
        failures = CounterMetricFamily(
            "stagevisor_stage_failures", "Calls of a stage that raised.", labels=["stage", "group"]
        )
        # Every group a stage ran in keeps its series (a counter that vanished and came back after two applies
        # would count the other group's calls as its own); the group running it now has one from its start.
        running_now = list(m.stage_groups.items())
        for stage, group in running_now + [key for key in m.series if key not in running_now]:
            totals = m.series.get((stage, group)) or _SeriesTotals()
            labels = [stage, group]
            processing.add_metric(labels, _cumulative(totals.buckets), totals.sum)
            calls.add_metric(labels, totals.calls)
            failures.add_metric(labels, totals.failures)
            running = m.stage_groups.get(stage) == group
            in_flight.add_metric(labels, m.stage_in_flight(stage, pids) if running else 0)
        yield from (processing, calls, in_flight, failures)

        queued = GaugeMetricFamily(
            "stagevisor_requests_queued", "Requests waiting for admission (--max-queued-requests).", labels=["model"]
        )
        rejected = CounterMetricFamily(
            "stagevisor_admission_rejections",
            "Requests refused by admission control (RESOURCE_EXHAUSTED / HTTP 429 or 503) without reaching a worker.",
            labels=["model", "reason"],
        )
        admission = m.admission
        queued.add_metric([m.model], admission.queued if admission is not None else 0)
        for reason, count in admission.rejected.items() if admission is not None else ():
            rejected.add_metric([m.model, reason], count)
        yield from (queued, rejected)

        handoffs = CounterMetricFamily(
            "stagevisor_edge_handoffs",
            "Requests handed over an edge (a `next` payload or the opening of a stream), by transport.",
            labels=["src", "dst", "transport"],
        )
        chunks = CounterMetricFamily(
            "stagevisor_edge_chunks", "Stream chunks received over an edge.", labels=["src", "dst", "transport"]
        )
        sent = CounterMetricFamily(
            "stagevisor_edge_bytes",
            "Bytes received over a cross-process edge (frames plus shared-memory buffers).",
            labels=["src", "dst", "transport"],
        )
        latency = HistogramMetricFamily(
            "stagevisor_edge_handoff_latency_seconds",
            "From the sender handing over to the receiving stage starting.",
            labels=["src", "dst", "transport"],
        )
        for (src, dst, transport), edge_totals in sorted(m.edges.items()):
            labels = [src, dst, transport]
            handoffs.add_metric(labels, edge_totals.handoffs)
            chunks.add_metric(labels, edge_totals.chunks)
            if transport != "in_process":
                sent.add_metric(labels, edge_totals.bytes)
            latency.add_metric(labels, _cumulative(edge_totals.latency_buckets), edge_totals.latency_sum)
        yield from (handoffs, chunks, sent, latency)

        state = GaugeMetricFamily(
            "stagevisor_group_state", "1 for the state a process group is in.", labels=["group", "state"]
        )
        restarts = CounterMetricFamily(
            "stagevisor_group_restarts", "Workers started after the first.", labels=["group"]
        )
        crashes = GaugeMetricFamily(
            "stagevisor_group_consecutive_crashes",
            "Crashes in a row of the group's worker not yet followed by a stable run; above 0 the group is "
            "down or restarting (BACKOFF), at 3 and more it is crash-looping.",
            labels=["group"],
        )
        silent = GaugeMetricFamily(
            "stagevisor_group_silent",
            "1 while the group's worker has missed three heartbeats in a row and is not yet killed for it (a "
            "silent replica takes no new requests while another answers).",
            labels=["group"],
        )
        rss = GaugeMetricFamily(
            "stagevisor_group_resident_memory_bytes", "Resident memory of the group's worker.", labels=["group"]
        )
        cpu = CounterMetricFamily(
            "stagevisor_group_cpu_seconds", "CPU time of the group's workers, every restart included.", labels=["group"]
        )
        threads = GaugeMetricFamily("stagevisor_group_threads", "Threads of the group's worker.", labels=["group"])
        fds = GaugeMetricFamily(
            "stagevisor_group_open_fds", "Open file descriptors of the group's worker.", labels=["group"]
        )
        gpu_used = GaugeMetricFamily(
            "stagevisor_group_gpu_memory_used_bytes",
            "GPU memory the group's worker uses (NVML); absent where it cannot be measured.",
            labels=["group", "gpu"],
        )
        budget = GaugeMetricFamily(
            "stagevisor_group_memory_budget_bytes",
            "The group's memory budget: its declared fraction x GPU memory (kind gpu_fraction), or --rss-budget (rss).",
            labels=["group", "kind"],
        )
        over = GaugeMetricFamily(
            "stagevisor_group_over_budget", "1 while the group uses more memory than its budget.", labels=["group"]
        )
        for g in groups:
            name = g["name"]
            for value in GROUP_STATES:
                state.add_metric([name, value], 1.0 if g.get("state") == value else 0.0)
            restarts.add_metric([name], self._restarts.total(g))
            crashes.add_metric([name], g.get("consecutive_crashes", 0))
            silent.add_metric([name], 1.0 if g.get("silent") else 0.0)
            res = g.get("resources")
            if not res:
                continue
            rss.add_metric([name], res["rss_bytes"])
            cpu.add_metric([name], res["cpu_seconds"])
            threads.add_metric([name], res["threads"])
            fds.add_metric([name], res["open_fds"])
            if res.get("gpu_memory_bytes") is not None and g.get("gpu") is not None:
                gpu_used.add_metric([name, str(g["gpu"])], res["gpu_memory_bytes"])
            if res.get("memory_budget_bytes") is not None:
                budget.add_metric([name, res["budget_kind"]], res["memory_budget_bytes"])
            over.add_metric([name], 1.0 if res.get("over_budget") else 0.0)
        self._restarts.forget_others(rows)
        yield from (state, restarts, crashes, silent, rss, cpu, threads, fds, gpu_used, budget, over)

        gpu_total = GaugeMetricFamily(
            "stagevisor_gpu_memory_used_bytes", "GPU memory the daemon's workers use on a GPU (NVML).", labels=["gpu"]
        )
        gpu_limit = GaugeMetricFamily(
            "stagevisor_gpu_memory_limit_bytes", "The placement limit x the GPU's memory.", labels=["gpu"]
        )
        gpu_over = GaugeMetricFamily(
            "stagevisor_gpu_over_limit",
            "1 while the workers on a GPU use more than its placement limit.",
            labels=["gpu"],
        )
        for gpu in m.gpus():
            if gpu.get("measured_bytes") is None or gpu.get("total_bytes") is None:
                continue
            labels = [str(gpu["id"])]
            gpu_total.add_metric(labels, gpu["measured_bytes"])
            gpu_limit.add_metric(labels, gpu["limit"] * gpu["total_bytes"])
            gpu_over.add_metric(labels, 1.0 if gpu.get("over_limit") else 0.0)
        yield from (gpu_total, gpu_limit, gpu_over)
