"""Request traces: which edges a request crossed and over which transport, for `edge_transports`.

A hop is one string, `transport \\x1f src \\x1f dst`, so traces travel as
`repeated string` (cheap to build, unlike one message per hop). In memory a
trace is a linked pair `(parent, hop)`, so extending it is O(1) on the hot
in-process path; it is flattened only when it crosses a process boundary or a
terminal stage reports it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Optional, Tuple

IN_PROCESS, GRPC = "in_process", "grpc"
_SEP = "\x1f"

Trace = Optional[Tuple["Trace", str]]
"""None (no hop yet) or (parent trace, hop)."""


@lru_cache(maxsize=4096)
def hop(src: str, dst: str, transport: str) -> str:
    return f"{transport}{_SEP}{src}{_SEP}{dst}"


def parse_hop(text: str) -> tuple[str, str, str]:
    """(src, dst, transport) of a hop string."""
    transport, src, dst = text.split(_SEP)
    return src, dst, transport


def flatten(trace: Trace) -> list[str]:
    """The hops of a trace, first to last."""
    hops: list[str] = []
    while trace is not None:
        trace, last = trace
        hops.append(last)
    hops.reverse()
    return hops


def from_hops(hops: Iterable[str]) -> Trace:
    trace: Trace = None
    for item in hops:
        trace = (trace, item)
    return trace
