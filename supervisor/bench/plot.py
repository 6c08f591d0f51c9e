"""The `stagevisor bench --plot` figure: latency and throughput at each measured load, one colour per topology.

Points only where a load was measured (no line drawn between concurrency 1 and 8
as if the loads between had been), medians with min-max error bars over the
repeats, every axis from zero so a 1.3x difference looks like one.
"""

from __future__ import annotations

from typing import Any

MARKERS = {"p50": "o", "p90": "^", "p99": "s"}
"""Latency percentile -> marker."""


def _x(row: dict[str, Any], open_loop: bool) -> float:
    return row["rate"] if open_loop else row["concurrency"]


def _error_bar(row: dict[str, Any], name: str, value: float | None, scale: float) -> list[float]:
    """[below, above] the median for matplotlib's yerr: the min-max spread over the repeats, or none."""
    spread = row.get("spread", {}).get(name)
    if value is None or spread is None or len(row.get("repeats", [])) < 2:
        return [0.0, 0.0]
    return [max(0.0, (value - spread[0]) * scale), max(0.0, (spread[1] - value) * scale)]


def plot(report: dict[str, Any], path: str) -> None:
    """Write a PNG or SVG (by the file's suffix) with matplotlib's non-interactive backend."""
    fig = figure(report)
    import matplotlib.pyplot as plt

    fig.savefig(path)
    plt.close(fig)


def require_matplotlib() -> Any:
    """The matplotlib module; ImportError naming the command that installs it (the `bench` extra) without it."""
    try:
        import matplotlib
    except ImportError as error:
        from stagevisor.supervisor.install import install_command

        raise ImportError(f"--plot needs matplotlib: {install_command('bench')}") from error
    return matplotlib


def figure(report: dict[str, Any]) -> Any:
    """The bench report's matplotlib Figure (ImportError naming the extra without matplotlib)."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    topologies = [t for t in report["topologies"] if t["rows"]]
    open_loop = bool(topologies and topologies[0]["rows"][0]["rate"])
    xlabel = "offered load (requests/s)" if open_loop else "concurrent clients"
    loads = sorted({_x(row, open_loop) for topology in topologies for row in topology["rows"]})
    # Topologies side by side at each load, a small shift apart, so their error bars do not hide each other.
    step = (max(loads) if loads else 1) * 0.012
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    panels = [("ttfa", "ttfa_p50", "time to first audio (ms)"), ("latency", "latency_p50", "end-to-end latency (ms)")]
    for axis, (metric, spread_name, title) in zip(axes, panels, strict=False):  # the third axis is throughput
        for index, topology in enumerate(topologies):
            shift = (index - (len(topologies) - 1) / 2) * step
            rows = topology["rows"]
            xs = [_x(row, open_loop) + shift for row in rows]
            for q, marker in MARKERS.items():
                ys = [row[metric][q] * 1000 if row[metric][q] is not None else float("nan") for row in rows]
                errors = (
                    list(zip(*(_error_bar(row, spread_name, row[metric][q], 1000) for row in rows), strict=True))
                    if q == "p50"
                    else None
                )
                axis.errorbar(
                    xs, ys, yerr=errors, fmt=marker, linestyle="none", color=f"C{index}", capsize=4, markersize=6
                )
        axis.set_title(title)
        axis.set_ylabel("milliseconds")
    axis = axes[2]
    for index, topology in enumerate(topologies):
        shift = (index - (len(topologies) - 1) / 2) * step
        rows = topology["rows"]
        axis.errorbar(
            [_x(row, open_loop) + shift for row in rows],
            [row["requests_per_second"] for row in rows],
            yerr=list(
                zip(
                    *(_error_bar(row, "requests_per_second", row["requests_per_second"], 1) for row in rows),
                    strict=True,
                )
            ),
            fmt="o",
            linestyle="none",
            color=f"C{index}",
            capsize=4,
        )
    axis.set_title("throughput (requests/s)")
    axis.set_ylabel("requests per second")
    for axis in axes:
        axis.set_xlabel(xlabel)
        axis.set_xticks(loads)
        axis.set_xlim(left=0, right=(max(loads) if loads else 1) * 1.1)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    keys = [
        Line2D([], [], color=f"C{i}", marker="o", linestyle="none", label=t["label"]) for i, t in enumerate(topologies)
    ]
    axes[2].legend(handles=keys, fontsize=8)
    keys += [Line2D([], [], color="black", marker=marker, linestyle="none", label=q) for q, marker in MARKERS.items()]
    for axis in axes[:2]:
        axis.legend(handles=keys, fontsize=8)
    fig.suptitle(heading(report))
    return fig


def heading(report: dict[str, Any]) -> str:
    """The figure's title: the model (null only for the daemon at --address), the load per point, the repeats."""
    workload = report["workload"]
    repeats = workload.get("repeats", 1)
    requests, duration = workload.get("requests_per_row"), workload.get("duration_per_row")
    # A workload has one or the other (commands/bench_options.py): requests per point, or seconds of --duration.
    per_point = f"{requests} request{'' if requests == 1 else 's'}" if requests else f"{duration:g} s"
    measured = report.get("machine")
    machine = f"; {measured['usable_cpus']} CPUs, load average {measured['load_average'][0]:g}" if measured else ""
    return (
        f"stagevisor bench: {report.get('model') or 'running daemon'}, {per_point} per point, "
        + (f"medians of {repeats} runs with min-max bars" if repeats > 1 else "one run per point (no spread)")
        + machine
    )
