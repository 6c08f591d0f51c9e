"""DaemonMetrics: every `stagevisor_` metric of one daemon, in its own Prometheus registry.

Request metrics (latency, time to first audio, real-time factor, chunk gaps)
are measured in the daemon with the client library's own types. Stage and edge
metrics come from the workers as deltas (MetricsReport frames on the data
plane) and are accumulated here (totals.py), so they survive worker restarts; a
custom collector (collector.py) exports them, with the process groups' states
and measured resources.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS, RTF_BOUNDS, quantile
from stagevisor.supervisor.metrics.collector import AdmissionCounts, WorkerCollector
from stagevisor.supervisor.metrics.totals import IN_FLIGHT_KEPT, EdgeTotals, SeriesTotals, StageTotals, add_counts
from stagevisor.supervisor.metrics.timings import request_timings
from stagevisor.supervisor.metrics.recent import RecentRequests
from stagevisor.supervisor.metrics.playback import Playback

log = logging.getLogger("stagevisor.metrics")

WINDOW_SECONDS = 60.0
"""`stagevisor top` shows stage quantiles over this window."""


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
        self.stages: dict[str, StageTotals] = {}
        """Stage -> its totals over every group that ran it (the windows of `top` and the autoscaler, in flight)."""
        self.series: dict[tuple[str, str], SeriesTotals] = {}
        """(stage, group that ran it) -> its totals there: the stage series' counts, kept after an apply moves it."""
        self.edges: dict[tuple[str, str, str], EdgeTotals] = {}
        self.registry.register(WorkerCollector(self))

    # ---- requests -------------------------------------------------------------------

    def start_request(self) -> RequestMeter:
        return RequestMeter(self)

    admission: AdmissionCounts | None = None
    """The gateway's admission control (queued, rejected by reason), read at scrape time; set by the daemon."""

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
                totals = self.stages[item.stage] = StageTotals()
            totals.add(item)
            series = self.series.get((item.stage, group))
            if series is None:
                series = self.series[item.stage, group] = SeriesTotals()
            series.add(item)
            if item.count or item.calls:
                totals.history.append((now, list(totals.buckets), totals.calls))
                while len(totals.history) > 2 and totals.history[1][0] <= now - WINDOW_SECONDS:
                    totals.history.popleft()
            totals.in_flight.pop((report.group, report.pid), None)  # last in the order: the newest report
            totals.in_flight[report.group, report.pid] = (report.pid, item.in_flight)
            if len(totals.in_flight) > IN_FLIGHT_KEPT:
                del totals.in_flight[next(iter(totals.in_flight))]
        for item in report.edges:
            key = (item.src, item.dst, item.transport)
            edge_totals = self.edges.get(key)
            if edge_totals is None:
                edge_totals = self.edges[key] = EdgeTotals()
            edge_totals.handoffs += item.handoffs
            edge_totals.chunks += item.chunks
            edge_totals.bytes += item.bytes
            if item.latency_count:
                add_counts(edge_totals.latency_buckets, item.latency_buckets)
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
