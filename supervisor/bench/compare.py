"""The bench's answer: ratios against the first topology, the verdict in words, whether the audio was identical."""

from __future__ import annotations

from typing import Any, Sequence

from stagevisor.supervisor.bench.results import SPREAD_METRICS, Row, TopologyResult


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


REFUSED = "RESOURCE_EXHAUSTED"
"""The status of a request the daemon's admission turned away (--max-concurrent-requests, --max-queued-requests):
counted as refused, not as failed."""


def failures(result: TopologyResult) -> str | None:
    """`N of M requests failed (K CODE at LOAD, ...)` over a topology's rows, refusals by admission said apart
    (`N of M requests were refused (K RESOURCE_EXHAUSTED at LOAD)`), or None when every request succeeded.

    Failed and refused requests are left out of its figures (loadgen.summarize): a run that mostly failed can read
    fast."""
    ended = [(count, code, _load(row)) for row in result.rows for code, count in row.summary.errors.items() if count]
    if not ended:
        return None
    total = sum(row.summary.requests for row in result.rows)
    refused = [item for item in ended if item[1] == REFUSED]
    failed = [item for item in ended if item[1] != REFUSED]
    parts = []
    if refused:
        parts.append(
            f"{_counts(refused)} of {total} requests were refused by the daemon's admission ({_where(refused)})"
        )
    if failed:
        parts.append(f"{_counts(failed)} of {total} requests failed ({_where(failed)})")
    return "; ".join(parts)


def _counts(items: Sequence[tuple[int, str, str]]) -> int:
    return sum(count for count, _, _ in items)


def _where(items: Sequence[tuple[int, str, str]]) -> str:
    return ", ".join(f"{count} {code} at {load}" for count, code, load in items)


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
    if len(valid) > 1:  # one topology measured is no comparison: no "best for"
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
