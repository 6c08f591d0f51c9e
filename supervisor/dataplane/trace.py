"""Request traces: which edges a request crossed and over which transport, and, when the daemon
collects metrics, how long each stage and stream handoff took.

A hop is one string, `transport \\x1f src \\x1f dst`, so traces travel as
`repeated string` (cheap to build, unlike one message per hop). In memory a
trace is a linked pair `(parent, item)`, so extending it is O(1) on the hot
in-process path; it is flattened only when it crosses a process boundary or a
terminal stage reports it. An item is a hop string, a Run of hop strings, or,
with metrics on, a Span list: a stage's process() call, or a stream handoff
(named by its hop).

A flattened trace is a copy: a stage that had not returned when its trace left
the process (it streams to a stage here that streams on to another process)
crosses with end 0. The stream's end marker carries the ends known by then
(`ended_stages_to_timings`), and the receiver closes its copies (`close_stages`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Optional, Tuple

IN_PROCESS, GRPC, GRPC_TCP = "in_process", "grpc", "grpc_tcp"
_SEP = "\x1f"

Trace = Optional[Tuple["Trace", Any]]
"""None (no hop yet) or (parent trace, hop string or Span)."""


Span = list
"""A timed part of a request: `[name, start, end]` in CLOCK_MONOTONIC seconds (one clock for every
process on a host); `end` is 0 while open. `name` is a stage name, or a hop string for a stream handoff
(start: first chunk sent; end: the receiving stage started). A plain list, not a class: one is made per
stage call on the in-process hot path, and a list literal costs a fraction of an object construction."""

Run = tuple
"""Consecutive direct in-process hops, first to last: a tuple of hop strings. The runtime builds
every run a chain of direct calls can take once, when it starts (see `runs`), so a direct hop
swaps one prebuilt run for the next instead of growing the trace by a pair."""


def runs(hops: tuple[str, ...]) -> tuple[Run, ...]:
    """The runs of a chain of direct hops: the first hop, the first two, ... all of them."""
    return tuple(hops[: k + 1] for k in range(len(hops)))


def is_hop_name(name: str) -> bool:
    return _SEP in name


@lru_cache(maxsize=4096)
def hop(src: str, dst: str, transport: str) -> str:
    return f"{transport}{_SEP}{src}{_SEP}{dst}"


def parse_hop(text: str) -> tuple[str, str, str]:
    """(src, dst, transport) of a hop string."""
    transport, src, dst = text.split(_SEP)
    return src, dst, transport


def items(trace: Trace) -> list[Any]:
    """Every item of a trace, first to last."""
    out: list[Any] = []
    while trace is not None:
        trace, last = trace
        if last.__class__ is tuple:  # a Run
            out.extend(reversed(last))
        else:
            out.append(last)
    out.reverse()
    return out


def flatten(trace: Trace) -> list[str]:
    """The hops of a trace, first to last."""
    hops: list[str] = []
    while trace is not None:
        trace, last = trace
        cls = last.__class__
        if cls is str:
            hops.append(last)
        elif cls is tuple:  # a Run
            hops.extend(reversed(last))
    hops.reverse()
    return hops


def from_hops(hops: Iterable[str]) -> Trace:
    trace: Trace = None
    for item in hops:
        trace = (trace, item)
    return trace


def to_timings(trace: Trace, out: Any) -> None:
    """Write every item into a Timings message, in order (a plain hop has start = end = 0)."""
    names, starts, ends = [], [], []
    for item in items(trace):
        if item.__class__ is str:
            names.append(item)
            starts.append(0.0)
            ends.append(0.0)
        else:
            names.append(item[0])
            starts.append(item[1])
            ends.append(item[2])
    out.names.extend(names)
    out.starts.extend(starts)
    out.ends.extend(ends)


def timing_tuples(timings: Any) -> list[tuple[str, float, float]]:
    """(name, start, end) of every item of a Timings message."""
    # A peer's message: unequal lists are read as far as they go, never raised on.
    return list(zip(timings.names, timings.starts, timings.ends, strict=False))


def from_timings(timings: Any) -> Trace:
    """The trace a Timings message describes (the inverse of to_timings)."""
    trace: Trace = None
    for name, start, end in zip(timings.names, timings.starts, timings.ends, strict=False):  # a peer's message
        if start == 0.0 and end == 0.0 and _SEP in name:
            trace = (trace, name)
        else:
            trace = (trace, [name, start, end])
    return trace


def _stage_spans(trace: Trace) -> list[Span]:
    """The stage spans of a trace (not its hops, nor its stream handoffs' spans), last first."""
    spans = []
    while trace is not None:
        trace, item = trace
        if item.__class__ is list and _SEP not in item[0]:
            spans.append(item)
    return spans


def ended_stages_to_timings(trace: Trace, out: Any) -> None:
    """Write the stage spans of a trace that have ended into a Timings message (a stream's end marker)."""
    ended = [span for span in _stage_spans(trace) if span[2]]
    out.names.extend(span[0] for span in ended)
    out.starts.extend(span[1] for span in ended)
    out.ends.extend(span[2] for span in ended)


def running_stages(trace: Trace) -> list[Span]:
    """The stage spans of a trace still open: stages that had not returned when the trace left their process."""
    return [span for span in _stage_spans(trace) if not span[2]]


def close_stages(running: list[Span], timings: Any) -> None:
    """Close each of `running` that a Timings message (a stream's end marker) says has ended.

    A span is named by its stage and its start: the very floats the opening carried."""
    ended = {(name, start): end for name, start, end in zip(timings.names, timings.starts, timings.ends, strict=False)}
    for span in running:
        if not span[2]:
            span[2] = ended.get((span[0], span[1]), 0.0)


def sent_at(trace: Trace) -> float:
    """When the handoff that ends `trace` began: a stream hop's start, or the sending stage's end (0: unknown)."""
    if trace is None:
        return 0.0
    parent, last = trace
    if last.__class__ is list:
        return last[1]
    while parent is not None:
        parent, item = parent
        if item.__class__ is list and _SEP not in item[0]:
            return item[2]
    return 0.0
