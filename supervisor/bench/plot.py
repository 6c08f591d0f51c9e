"""The `stagevisor bench --plot` figure: latency percentiles and throughput against load, one line per topology."""

from __future__ import annotations

from typing import Any


def plot(report: dict[str, Any], path: str) -> None:
    """Write a PNG or SVG (by the file's suffix) with matplotlib's non-interactive backend."""
    try:
        import matplotlib
    except ImportError as error:
        from stagevisor.supervisor.errors import install_command

        raise ImportError(f"--plot needs matplotlib: {install_command('bench')}") from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = [t for t in report["topologies"] if t["rows"]]
    open_loop = bool(topologies and topologies[0]["rows"][0]["rate"])
    xlabel = "offered load (requests/s)" if open_loop else "concurrent clients"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    panels = [("ttfa", "time to first audio (ms)"), ("latency", "end-to-end latency (ms)")]
    for axis, (metric, title) in zip(axes, panels, strict=False):  # the third axis is throughput
        for index, topology in enumerate(topologies):
            xs = [row["rate"] if open_loop else row["concurrency"] for row in topology["rows"]]
            color = f"C{index}"
            for q, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ys = [(row[metric][q] or 0) * 1000 for row in topology["rows"]]
                axis.plot(xs, ys, style, color=color, marker="o" if q == "p50" else None)
        axis.set_xticks(
            sorted(
                {
                    row["rate"] if open_loop else row["concurrency"]
                    for topology in topologies
                    for row in topology["rows"]
                }
            )
        )
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("milliseconds")
        axis.grid(alpha=0.3)
    axis = axes[2]
    for index, topology in enumerate(topologies):
        xs = [row["rate"] if open_loop else row["concurrency"] for row in topology["rows"]]
        axis.plot(
            xs,
            [row["requests_per_second"] for row in topology["rows"]],
            "-",
            color=f"C{index}",
            marker="o",
            label=topology["label"],
        )
    axis.set_title("throughput (requests/s)")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("requests per second")
    axis.grid(alpha=0.3)
    axis.set_xticks(
        sorted(
            {row["rate"] if open_loop else row["concurrency"] for topology in topologies for row in topology["rows"]}
        )
    )
    from matplotlib.lines import Line2D

    axis.legend(
        handles=[Line2D([], [], color=f"C{i}", marker="o", label=t["label"]) for i, t in enumerate(topologies)],
        fontsize=8,
    )

    keys = [Line2D([], [], color=f"C{i}", marker="o", label=t["label"]) for i, t in enumerate(topologies)]
    keys += [
        Line2D([], [], color="black", linestyle="-", label="p50"),
        Line2D([], [], color="black", linestyle="--", label="p90"),
        Line2D([], [], color="black", linestyle=":", label="p99"),
    ]
    for axis in axes[:2]:
        axis.legend(handles=keys, fontsize=8)
    fig.suptitle(
        f"stagevisor bench: {report.get('model') or 'running daemon'}, "
        f"{report['workload']['requests_per_row'] or ''} requests per point "
        "(solid p50, dashed p90, dotted p99)"
    )
    fig.savefig(path)
    plt.close(fig)
