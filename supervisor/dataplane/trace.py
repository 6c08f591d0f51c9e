"""Request traces: which edges a request crossed and over which transport, and, when the daemon
collects metrics, how long each stage and stream handoff took.

A hop is one string, `transport \\x1f src \\x1f dst`, so traces travel as
`repeated string` (cheap to build, unlike one message per hop). In memory a
trace is a linked pair `(parent, item)`, so extending it is O(1) on the hot
in-process path; it is flattened only when it crosses a process boundary or a
terminal stage reports it. An item is a hop string or, with metrics on, a
`Span`: a stage's process() call, or a stream handoff (named by its hop).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable, Optional, Tuple

IN_PROCESS, GRPC = "in_process", "grpc"
_SEP = "\x1f"

Trace = Optional[Tuple["Trace", Any]]
"""None (no hop yet) or (parent trace, hop string or Span)."""


class Span:
    """A timed part of a request, in CLOCK_MONOTONIC seconds (one clock for every process on a host).

    `name` is a stage name, or a hop string for a stream handoff (start: first
    chunk sent; end: the receiving stage started). `end` is 0 while open.
    """

    __slots__ = ("name", "start", "end")

    def __init__(self, name: str, start: float, end: float = 0.0) -> None:
        self.name = name
        self.start = start
        self.end = end

    @property
    def is_hop(self) -> bool:
        return _SEP in self.name

    def __repr__(self) -> str:
        return f"Span({self.name!r}, {self.start!r}, {self.end!r})"


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
        out.append(last)
    out.reverse()
    return out


def flatten(trace: Trace) -> list[str]:
    """The hops of a trace, first to last."""
    hops: list[str] = []
    while trace is not None:
        trace, last = trace
        if last.__class__ is str:
            hops.append(last)
    hops.reverse()
    return hops


def from_hops(hops: Iterable[str]) -> Trace:
    trace: Trace = None
    for item in hops:
        trace = (trace, item)
    return trace


def to_timings(trace: Trace, out: Any) -> None:
    """Append every item to a `repeated Timing` field, in order (a plain hop has start = end = 0)."""
    for item in items(trace):
        if item.__class__ is str:
            out.add(name=item)
        else:
            out.add(name=item.name, start=item.start, end=item.end)


def from_timings(timings: Any) -> Trace:
    """The trace a `repeated Timing` field describes (the inverse of to_timings)."""
    trace: Trace = None
    for timing in timings:
        if timing.start == 0.0 and timing.end == 0.0 and _SEP in timing.name:
            trace = (trace, timing.name)
        else:
            trace = (trace, Span(timing.name, timing.start, timing.end))
    return trace


def sent_at(trace: Trace) -> float:
    """When the handoff that ends `trace` began: a stream hop's start, or the sending stage's end (0: unknown)."""
    if trace is None:
        return 0.0
    parent, last = trace
    if last.__class__ is Span:
        return last.start
    while parent is not None:
        parent, item = parent
        if item.__class__ is Span and not item.is_hop:
            return item.end
    return 0.0
