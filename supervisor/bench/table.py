"""The `stagevisor bench` report as a text table: one line per topology and load, a unit in every header."""

from __future__ import annotations

import textwrap
from typing import Any

from stagevisor.supervisor.bench.compare import REFUSED


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _with_spread(row: dict[str, Any], name: str, value: float | None, scale: float, digits: int) -> str:
    """`median (min-max)` over the repeats, or the value alone after one run."""
    if value is None:
        return "-"
    spread = row.get("spread", {}).get(name)
    text = f"{value * scale:.{digits}f}"
    if spread is not None and len(row.get("repeats", [])) > 1:
        text += f" ({spread[0] * scale:.{digits}f}-{spread[1] * scale:.{digits}f})"
    return text


COLUMNS = (
    ("topology", "<", 34),
    ("load", ">", 6),
    ("ok req/s", ">", 19),
    ("audio s/s", ">", 19),
    ("ttfa p50 ms", ">", 22),
    ("ttfa p90 ms", ">", 11),
    ("e2e p50 ms", ">", 22),
    ("e2e p99 ms", ">", 10),
    ("rtf x", ">", 5),
    ("stall p90 ms", ">", 12),
    ("refused n", ">", 9),
    ("failed n", ">", 8),
    ("req/s ratio x", ">", 13),
    ("ttfa Δ ms", ">", 9),
)
"""The table's columns, each header with its unit (x: a ratio, n: a count; load: c = clients, /s = requests/s).
`ok req/s` and every figure after it are of the requests that completed; `refused n` and `failed n` count the
others, so a run whose requests were mostly turned away shows it beside its throughput."""


def _line(cells: list[str], label_width: int) -> str:
    """One row; the topology column as wide as the longest label (at least its own width): a label cut short could
    read as another topology's."""
    widths = [
        (align, max(width, label_width) if index == 0 else width) for index, (_, align, width) in enumerate(COLUMNS)
    ]
    return " ".join(f"{cell:{align}{width}}" for cell, (align, width) in zip(cells, widths, strict=True)).rstrip()


ERROR_WIDTH = 100
"""Characters of a topology's error per line of the table."""


def _print_error(label: str, error: dict[str, Any], label_width: int) -> None:
    """A topology that could not be measured: its code and its whole message (what to do is often at its end),
    wrapped under the columns after its label."""
    lines = textwrap.wrap(
        f"{error['code']}: {error['message']}", width=ERROR_WIDTH, break_long_words=False, break_on_hyphens=False
    ) or [""]
    print(f"{label:<{label_width}} {lines[0]}")
    for line in lines[1:]:
        print(f"{'':<{label_width}} {line}")


def print_table(report: dict[str, Any]) -> None:
    repeats = report["workload"].get("repeats", 1)
    if repeats > 1:
        print(f"medians of {repeats} interleaved runs per point, (min-max) over the runs")
    label_width = max([COLUMNS[0][2], *(len(t["label"]) for t in report["topologies"])])
    print(_line([name for name, _, _ in COLUMNS], label_width))
    for topology in report["topologies"]:
        label = topology["label"]
        if topology["error"]:
            _print_error(label, topology["error"], label_width)
            continue
        for row in topology["rows"]:
            load = f"c{row['concurrency']}" if row["concurrency"] else f"{row['rate']:g}/s"
            refused = row["errors"].get(REFUSED, 0)
            failed = sum(row["errors"].values()) - refused
            delta = row["ratios"].get("ttfa_p50_delta_seconds")
            noise = row.get("within_spread", {})
            ratio = _x(row["ratios"].get("requests_per_second"))
            print(
                _line(
                    [
                        label,
                        load,
                        _with_spread(row, "requests_per_second", row["requests_per_second"], 1, 2),
                        _with_spread(row, "audio_seconds_per_second", row["audio_seconds_per_second"], 1, 2),
                        _with_spread(row, "ttfa_p50", row["ttfa"]["p50"], 1000, 1),
                        _ms(row["ttfa"]["p90"]),
                        _with_spread(row, "latency_p50", row["latency"]["p50"], 1000, 1),
                        _ms(row["latency"]["p99"]),
                        _x(row["real_time_factor"]),
                        _ms(row["stall"].get("p90")),
                        str(refused),
                        str(failed),
                        ratio + ("~" if noise.get("requests_per_second") else ""),
                        ("-" if delta is None else f"{delta * 1000:+.1f}") + ("~" if noise.get("ttfa_p50") else ""),
                    ],
                    label_width,
                )
            )
            label = ""
        print()
    print(
        "units: load cN = N clients in a closed loop, R/s = requests per second offered (open loop); "
        "s/s = audio seconds per wall second; ms = milliseconds; x = a ratio; n = a count"
    )
    print(
        "ok req/s and the figures after it are of the requests that completed; refused n = turned away by the "
        "daemon's admission (RESOURCE_EXHAUSTED), failed n = ended with any other error"
    )
    if any(any(row.get("within_spread", {}).values()) for t in report["topologies"] for row in t["rows"]):
        print("~: the difference from the first topology is within the spread of the runs (not a measured difference)")
    measured = report.get("machine")
    if measured:
        print(
            f"machine: {measured['usable_cpus']} of {measured['cpus']} CPUs usable; load average "
            f"{measured['load_average'][0]:g} (1 min) at the start, {measured['load_average_after'][0]:g} at the end"
        )
    print("worker resources per measured run (CPU seconds, peak RSS MiB; GPU n/a on this machine):")
    for topology in report["topologies"]:
        for row in topology["rows"]:
            load = f"c{row['concurrency']}" if row["concurrency"] else f"{row['rate']:g}/s"
            parts = [
                f"{g} {r['cpu_seconds'] if r['cpu_seconds'] is not None else '-'} s "
                + ("- MiB" if r["peak_rss_bytes"] is None else f"{r['peak_rss_bytes'] / 2**20:.0f} MiB")
                for g, r in row["resources"].items()
            ]
            print(f"  {topology['label']:<{label_width}} {load:>6}: " + "; ".join(parts))
    if report["identical"] is not None:
        same = report["identical"]
        print(
            "audio identical across topologies: "
            + (
                "yes"
                if same["identical"]
                else "NO: " + ", ".join(f"text {d['text_index'] + 1} on `{d['topology']}`" for d in same["differing"])
            )
        )
    print()
    for line in report["summary"]:
        print(line)
