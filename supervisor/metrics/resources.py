"""Measured resources of each process group's worker (psutil, NVML) checked against its memory budget.

A group's budget is its declared GPU memory fraction x its GPU's total memory
(measured with NVML), or, where the operator gave one, `--rss-budget GROUP=SIZE`
on its resident memory. Without NVML (a CPU machine, no driver, nvidia-ml-py
not installed) GPU figures are None ("n/a"), never zero and never an error.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import psutil

from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import GroupResources

log = logging.getLogger("stagevisor.resources")
MIB = 1024 * 1024
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE | re.ASCII)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": MIB, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """`512M`, `2G`, `1.5GiB`, `1048576` -> bytes (binary units); ValueError naming the text."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"size {text!r} is malformed; use bytes or a number with K, M, G or T (e.g. 512M)")
    unit = (match.group(2) or "").lower()[:1]
    return int(float(match.group(1)) * _UNITS[unit])


def parse_rss_budgets(pairs: list[str], groups: list[str]) -> dict[str, int]:
    """`GROUP=SIZE` strings -> {group: bytes}; ValueError naming a malformed pair or an unknown group."""
    budgets: dict[str, int] = {}
    for pair in pairs:
        group, sep, size = pair.partition("=")
        if not sep or not group.strip():
            raise ValueError(f"--rss-budget {pair!r} is malformed; expected GROUP=SIZE, e.g. vocoder=2G")
        if group.strip() not in groups:
            raise ValueError(f"--rss-budget names no process group {group.strip()!r}; groups: {', '.join(groups)}")
        budgets[group.strip()] = parse_size(size)
    return budgets


def mib(value: float) -> str:
    return f"{value / MIB:.1f} MiB"


@dataclass
class GroupUsage:
    """What one group's worker uses, and its budget. `gpu_memory_bytes` None = not measurable."""

    rss_bytes: int = 0
    cpu_seconds: float = 0.0
    cpu_percent: float = 0.0
    threads: int = 0
    open_fds: int = 0
    gpu_memory_bytes: int | None = None
    memory_budget_bytes: int | None = None
    budget_kind: str = ""
    over_budget: bool = False
    over_reason: str = ""
    pid: int = 0
    """The worker these figures were measured of (0: none ran): a new worker has none until it is sampled."""

    def report(self) -> GroupResources:
        """What status, topology and `top` show of it."""
        return GroupResources(
            rss_bytes=self.rss_bytes,
            cpu_seconds=self.cpu_seconds,
            cpu_percent=self.cpu_percent,
            threads=self.threads,
            open_fds=self.open_fds,
            gpu_memory_bytes=self.gpu_memory_bytes,
            memory_budget_bytes=self.memory_budget_bytes,
            budget_kind=self.budget_kind,
            over_budget=self.over_budget,
        )


class GpuProbe:
    """GPU memory figures through NVML (`nvml`: the pynvml module, or None to measure nothing)."""

    def __init__(self, nvml: Any = None) -> None:
        self.nvml = nvml
        self._reported: set[tuple[int, str]] = set()

    @classmethod
    def from_driver(cls) -> GpuProbe:
        """NVML through nvidia-ml-py, when it is installed and a driver answers; otherwise a probe of nothing."""
        try:
            import pynvml  # nvidia-ml-py; optional

            pynvml.nvmlInit()
            return cls(pynvml)
        except Exception as error:  # noqa: BLE001 - no module, no driver, no GPU: GPU figures are n/a
            log.debug("NVML not available (%s): GPU memory is not measured", error)
            return cls()

    def _cannot_tell(self, gpu: int, what: str, error: Exception) -> None:
        """Log why NVML gave no figure: a warning the first time for this GPU and question, debug after (sampled
        every few seconds, the same failure would fill the log)."""
        first = (gpu, what) not in self._reported
        self._reported.add((gpu, what))
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "NVML cannot tell the %s of GPU %d (%s: %s): shown as n/a",
            what,
            gpu,
            type(error).__name__,
            error,
        )

    def total_bytes(self, gpu: int) -> int | None:
        if self.nvml is None:
            return None
        try:
            return int(self.nvml.nvmlDeviceGetMemoryInfo(self.nvml.nvmlDeviceGetHandleByIndex(gpu)).total)
        except Exception as error:  # noqa: BLE001 - a GPU index the driver lacks, a driver error: n/a
            self._cannot_tell(gpu, "total memory", error)
            return None

    def used_by_pid(self, gpu: int) -> dict[int, int] | None:
        """{pid: bytes} of the compute processes on a GPU; None when NVML cannot tell."""
        if self.nvml is None:
            return None
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu)
            used: dict[int, int] = {}
            for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used[int(proc.pid)] = used.get(int(proc.pid), 0) + int(proc.usedGpuMemory or 0)
            return used
        except Exception as error:  # noqa: BLE001 - as total_bytes
            self._cannot_tell(gpu, "memory used by each process", error)
            return None


class ResourceSampler:
    """Samples every group's worker and checks budgets. One instance per daemon; call `sample` periodically."""

    def __init__(
        self,
        plan: Plan,
        rss_budgets: Mapping[str, int] | None = None,
        gpu_probe: GpuProbe | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.rss_budgets = dict(rss_budgets or {})
        self.gpu = gpu_probe if gpu_probe is not None else GpuProbe.from_driver()
        self.clock = clock
        self.usage: dict[str, GroupUsage] = {}
        self.gpus: dict[int, dict[str, Any]] = {}
        self._processes: dict[str, psutil.Process] = {}
        self._cpu_base: dict[str, float] = {}
        self._cpu_last: dict[str, tuple[float, float]] = {}
        """group -> (sample time, CPU seconds of the current worker)."""
        self._gpu_totals = {b.id: self.gpu.total_bytes(b.id) for b in plan.gpus}

    def sample(self, pids: Mapping[str, int]) -> list[tuple[str, bool, str]]:
        """Measure each group's worker (pid 0: none running); return budget changes as
        (subject, now over, message) — the subject is a group name or `gpu:<id>`."""
        now = self.clock()
        gpu_used = {gpu: self.gpu.used_by_pid(gpu) for gpu in self._gpu_totals}
        changes: list[tuple[str, bool, str]] = []
        for group in _worker_groups(self.plan):
            usage = self.usage.setdefault(group.name, GroupUsage())
            self._measure(group.name, pids.get(group.name, 0), usage, now)
            used = gpu_used.get(group.gpu) if group.gpu is not None else None
            pid = pids.get(group.name, 0)
            usage.gpu_memory_bytes = used.get(pid) if (used is not None and pid and pid in used) else None
            was_over = usage.over_budget
            self._check_budget(group, usage)
            if usage.over_budget != was_over:
                changes.append(
                    (
                        group.name,
                        usage.over_budget,
                        usage.over_reason or f"group {group.name!r} is back within its memory budget",
                    )
                )
        for budget in self.plan.gpus:
            total = self._gpu_totals.get(budget.id)
            used = gpu_used.get(budget.id)
            ours = [pids.get(name, 0) for name in budget.groups]
            measured = sum(used.get(pid, 0) for pid in ours if pid) if used is not None else None
            previous = self.gpus.get(budget.id, {}).get("over_limit", False)
            over = bool(total and measured is not None and measured > budget.limit * total)
            self.gpus[budget.id] = {"total_bytes": total, "measured_bytes": measured, "over_limit": over}
            if over != previous:
                message = (
                    (
                        f"GPU {budget.id}: the workers use {mib(measured or 0)}, over the placement limit "
                        f"{budget.limit:g} x {mib(total or 0)}; lower the groups' fractions or move a group "
                        "to another GPU"
                    )
                    if over
                    else f"GPU {budget.id} is back within its placement limit"
                )
                changes.append((f"gpu:{budget.id}", over, message))
        return changes

    def _measure(self, group: str, pid: int, usage: GroupUsage, now: float) -> None:
        process = self._processes.get(group)
        if process is not None and process.pid != pid:
            # A new worker: what the old one used stays in the group's CPU seconds.
            self._cpu_base[group] = self._cpu_base.get(group, 0.0) + self._cpu_last.get(group, (0.0, 0.0))[1]
            self._cpu_last.pop(group, None)
            self._processes.pop(group, None)
            process = None
        if not pid:
            usage.rss_bytes, usage.threads, usage.open_fds, usage.cpu_percent = 0, 0, 0, 0.0
            usage.cpu_seconds = self._cpu_base.get(group, 0.0)
            usage.pid = 0
            return
        try:
            if process is None:
                process = self._processes[group] = psutil.Process(pid)
            with process.oneshot():
                rss = process.memory_info().rss
                times = process.cpu_times()
                threads = process.num_threads()
                fds = process.num_fds() if hasattr(process, "num_fds") else 0
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return  # gone between the daemon's view and ours; the next sample sees the new state
        cpu = times.user + times.system
        last = self._cpu_last.get(group)
        if last is not None and now > last[0]:
            usage.cpu_percent = max(0.0, (cpu - last[1]) / (now - last[0]) * 100.0)
        self._cpu_last[group] = (now, cpu)
        usage.rss_bytes, usage.threads, usage.open_fds = rss, threads, fds
        usage.cpu_seconds = self._cpu_base.get(group, 0.0) + cpu
        usage.pid = pid

    def _check_budget(self, group: Any, usage: GroupUsage) -> None:
        reasons = []
        usage.memory_budget_bytes, usage.budget_kind = None, ""
        total = self._gpu_totals.get(group.gpu) if group.gpu is not None else None
        if group.total_gpu_memory_fraction is not None and total:
            budget = int(group.total_gpu_memory_fraction * total)
            usage.memory_budget_bytes, usage.budget_kind = budget, "gpu_fraction"
            if usage.gpu_memory_bytes is not None and usage.gpu_memory_bytes > budget:
                reasons.append(
                    f"group {group.name!r} uses {mib(usage.gpu_memory_bytes)} of GPU {group.gpu}, over "
                    f"its budget {group.total_gpu_memory_fraction:g} x {mib(total)} = {mib(budget)}; "
                    "raise its declared fraction or move a stage out of the group"
                )
        rss_budget = self.rss_budgets.get(group.name, self.rss_budgets.get(group.name.partition("/")[0]))
        if rss_budget is not None:
            usage.memory_budget_bytes, usage.budget_kind = rss_budget, "rss"
            if usage.rss_bytes > rss_budget:
                reasons.append(
                    f"group {group.name!r} uses {mib(usage.rss_bytes)} resident memory, over its "
                    f"--rss-budget {mib(rss_budget)}; raise the budget or move a stage out of the group"
                )
        usage.over_budget = bool(reasons)
        usage.over_reason = "; ".join(reasons)

    def warnings(self) -> list[str]:
        """One line per live over-budget condition, for `stagevisor status`."""
        lines = [u.over_reason for u in self.usage.values() if u.over_budget]
        for gpu, info in sorted(self.gpus.items()):
            if info["over_limit"]:
                budget = next(b for b in self.plan.gpus if b.id == gpu)
                lines.append(
                    f"GPU {gpu}: the workers use {mib(info['measured_bytes'])}, over the placement limit "
                    f"{budget.limit:g} x {mib(info['total_bytes'])}"
                )
        return lines


def _worker_groups(plan: Plan) -> list[Any]:
    """Each worker as the group it runs: the group itself, or per replica one named `group/i` on its own GPU."""
    from dataclasses import replace

    groups = []
    for group in plan.groups:
        if group.replicas == 1:
            groups.append(group)
        else:
            groups.extend(replace(group, name=w.name, gpu=w.gpu) for w in group.workers())
    return groups
