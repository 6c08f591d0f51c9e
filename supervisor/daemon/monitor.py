"""Monitor: the daemon's observability — resource sampling, budget warnings, and its metrics registry.

The daemon owns one Monitor. It samples every group's worker each
`interval` seconds (psutil, NVML), turns budget changes into WARNING events
on the daemon's event stream (`stagevisor events`), and, with metrics on,
holds the DaemonMetrics that the /metrics endpoint exposes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent
from stagevisor.supervisor.metrics.resources import GroupUsage, ResourceSampler
from stagevisor.supervisor.plan import GpuBudget, Plan
from stagevisor.supervisor.reports import GpuReport, GroupResources, GroupSummary, StageSummary, SummaryReport

log = logging.getLogger("stagevisor.daemon")


@dataclass(frozen=True)
class ConditionEvent(LifecycleEvent):
    """A condition on the event stream beside the lifecycle transitions: `kind` WARNING or NOTICE.

    A LifecycleEvent (old_state = new_state = the group's state) so every watcher prints it the same way.
    """

    kind: str = "WARNING"

    @classmethod
    def now(cls, group: str, state: GroupState, reason: str, kind: str, pid: int = 0) -> ConditionEvent:
        """A condition of `group` (its state `state`) at this moment; group "" for one of the whole daemon."""
        return cls(group, state, state, pid, reason, time.time(), kind)


class Monitor:
    """Samples resources, checks budgets, and (with metrics on) feeds the Prometheus registry."""

    def __init__(
        self,
        plan: Plan,
        runners: Mapping[str, Any],
        publish: Callable[[LifecycleEvent], None],
        *,
        metrics: bool = True,
        rss_budgets: Mapping[str, int] | None = None,
        interval: float = 1.0,
        sampler: ResourceSampler | None = None,
    ) -> None:
        from stagevisor.supervisor.metrics.registry import DaemonMetrics
        from stagevisor.supervisor.metrics.timings import SpanExporter

        self.plan = plan
        self.runners = runners
        self.publish = publish
        self.interval = interval
        self.sampler = sampler or ResourceSampler(plan, rss_budgets)
        self.metrics = (
            DaemonMetrics(
                plan.model,
                {s.name: plan.group_of(s.name).name for s in plan.stages},
                groups=self.group_rows,
                gpus=self.gpu_rows,
                spans=SpanExporter.from_env(),
            )
            if metrics
            else None
        )
        self.metrics_url = ""
        self._task: asyncio.Task | None = None
        self._shown: dict[int, Any] = {}
        """The runners the last group rows showed, by restart count id (group_rows)."""

    # ---- sampling ---------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="resource-monitor")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.metrics is not None and self.metrics.spans is not None:
            await asyncio.to_thread(self.metrics.close)  # the last spans go out before the daemon exits

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - measuring must never take the daemon down
                log.warning("resource sampling failed", exc_info=True)
            await asyncio.sleep(self.interval)

    def pids(self) -> dict[str, int]:
        return {name: runner.pid or 0 for name, runner in self.runners.items()}

    def sample(self) -> None:
        """One measurement of every worker; budget changes become events (and a counter)."""
        for subject, over, message in self.sampler.sample(self.pids()):
            runner = self.runners.get(subject)
            state = runner.state if runner is not None else GroupState.READY
            pid = (runner.pid or 0) if runner is not None else 0
            if over:
                log.warning("%s", message)
                if self.metrics is not None and runner is not None:
                    self.metrics.budget_warnings.labels(subject).inc()
            else:
                log.info("%s", message)
            self.publish(ConditionEvent.now(subject, state, message, "WARNING" if over else "NOTICE", pid))

    # ---- reports ----------------------------------------------------------------------

    def usage(self, group: str) -> GroupUsage | None:
        return self.sampler.usage.get(group)

    def resources(self, group: str) -> GroupResources | None:
        """What was measured of a group's (or replica's) worker; None while it has not been sampled.

        A worker that replaced a dead one is not sampled for up to a second: until it is, the figures are the
        dead one's (0 bytes once it was gone), which status showed as `pid 4885 ... rss 0.0 MiB`."""
        usage = self.usage(group)
        runner = self.runners.get(group)
        if usage is None or (runner is not None and runner.pid and usage.pid != runner.pid):
            return None
        return usage.report()

    def group_rows(self) -> list[dict[str, Any]]:
        """One row per worker (a group, or `group/i` per replica): what the per-group gauges are labelled by; then,
        once, a `retired` row per runner the last rows showed that the daemon no longer runs (an apply, a scale
        or a restart without a pause retired it), so restarts it had since that scrape are still counted."""
        live = list(self.runners.items())
        rows = []
        for name, runner in live:
            rows.append(
                {
                    "name": name,
                    "gpu": runner.spec.group.gpu,
                    "state": runner.state.value,
                    "pid": runner.pid or 0,
                    "restarts": runner.restarts,
                    "restart_count_id": runner.restart_count_id,
                    "consecutive_crashes": runner.consecutive_crashes,
                    "silent": bool(runner.silence),
                    "resources": None if (usage := self.usage(name)) is None else usage.report().to_json(),
                }
            )
        held = {runner.restart_count_id for _, runner in live}
        rows.extend(
            {"name": runner.name, "retired": True, "restarts": runner.restarts, "restart_count_id": count_id}
            for count_id, runner in self._shown.items()
            if count_id not in held
        )
        self._shown = {runner.restart_count_id: runner for _, runner in live}
        return rows

    def adopt_plan(self, plan: Plan) -> None:
        """Measure the workers of a rescaled plan from now on."""
        self.plan = plan
        self.sampler.plan = plan

    def gpu_rows(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "limit": b.limit, **self.sampler.gpus.get(b.id, {})} for b in self.plan.gpus]

    def gpu_report(self, budget: GpuBudget) -> GpuReport:
        """A GPU's placement budget with what NVML measured on it (None where it cannot tell)."""
        info = self.sampler.gpus.get(budget.id, {})
        return GpuReport(
            id=budget.id,
            total_gpu_memory_fraction=budget.total_gpu_memory_fraction,
            limit=budget.limit,
            groups=budget.groups,
            total_bytes=info.get("total_bytes"),
            measured_bytes=info.get("measured_bytes"),
            over_limit=bool(info.get("over_limit")),
        )

    def warnings(self) -> list[str]:
        return self.sampler.warnings()

    def summary(self, state: str, in_flight: int) -> SummaryReport:
        """What `stagevisor top` shows (the admin API's GetMetricsSummary)."""
        from stagevisor.supervisor.metrics.registry import WINDOW_SECONDS

        pids = self.pids()
        stages = []
        for stage in self.plan.stages:
            group = self.plan.group_of(stage.name).name
            summary = StageSummary(stage.name, group, in_flight=0, count=0)
            if self.metrics is not None:
                count, p50, p99 = self.metrics.stage_window(stage.name)
                summary = StageSummary(
                    stage.name, group, self.metrics.stage_in_flight(stage.name, pids), count, p50, p99
                )
            stages.append(summary)
        # Per worker, from what each reported: a replica (`group/i`) has its own calls, not its group's.
        metrics = self.metrics
        groups = tuple(
            GroupSummary(
                name=name,
                state=runner.state.value,
                pid=runner.pid or 0,
                restarts=runner.restarts,
                in_flight=metrics.worker_in_flight(name, pids.get(name, 0)) if metrics is not None else 0,
                resources=self.resources(name),
            )
            for name, runner in list(self.runners.items())
        )
        return SummaryReport(state, WINDOW_SECONDS, in_flight, groups, tuple(stages), tuple(self.warnings()))
