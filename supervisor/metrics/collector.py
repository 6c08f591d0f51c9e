"""The scrape-time collector of a daemon's metrics: worker-reported totals, admission, groups and GPUs as families."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from stagevisor.supervisor.metrics.buckets import LATENCY_BOUNDS
from stagevisor.supervisor.metrics.totals import EdgeTotals, SeriesTotals

GROUP_STATES = ("STOPPED", "STARTING", "READY", "BACKOFF", "STOPPING", "FAILED")
_LE = [floatToGoString(b) for b in LATENCY_BOUNDS] + ["+Inf"]
"""Bucket bounds spelled as prometheus_client spells its own Histograms' (`1.0`, not `1`): one bound, one label."""


def _cumulative(counts: list[int]) -> list[tuple[str, int]]:
    out, total = [], 0
    for le, count in zip(_LE, counts, strict=True):
        total += count
        out.append((le, total))
    return out


class AdmissionCounts(Protocol):
    """What the collector reads of the gateway's admission control (dataplane/admission.py's Admission)."""

    @property
    def queued(self) -> int:
        """Requests waiting for a slot now."""

    @property
    def rejected(self) -> Mapping[str, int]:
        """Requests refused so far, by reason (BUSY, QUEUE_TIMEOUT, DRAINING, ...)."""


class CollectedMetrics(Protocol):
    """What the collector reads of a daemon's metrics (DaemonMetrics, registry.py) at each scrape."""

    model: str
    admission: AdmissionCounts | None
    """The gateway's admission control, or None."""
    stage_groups: dict[str, str]
    """Stage -> the group running it now."""
    series: dict[tuple[str, str], SeriesTotals]
    edges: dict[tuple[str, str, str], EdgeTotals]
    groups: Callable[[], list[dict[str, Any]]]
    """Each group's state and resources, once per scrape."""
    gpus: Callable[[], list[dict[str, Any]]]

    def stage_in_flight(self, stage: str, pids: dict[str, int]) -> int: ...


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


class WorkerCollector:
    """Exports worker-reported totals and group resources as metric families at scrape time."""

    def __init__(self, metrics: CollectedMetrics) -> None:
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
            "Time a stage's process() took per timed call (every call while a worker starts fewer than 1000 "
            "chains of stage calls a second, an even sample above, and always those of requests whose timings "
            "are read).",
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
            totals = m.series.get((stage, group)) or SeriesTotals()
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
            "Requests handed over an edge (a `next` payload or the opening of a stream), by transport: every handoff, "
            "whether its request then completed, failed or was cancelled (`stagevisor topology` counts completed "
            "requests only).",
            labels=["src", "dst", "transport"],
        )
        chunks = CounterMetricFamily(
            "stagevisor_edge_chunks",
            "Stream chunks received over an edge (in_process: handed to a stage of the same process).",
            labels=["src", "dst", "transport"],
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
