"""How placement messages name stages, edges and fractions: the wording every placement rule shares. Pure."""

from __future__ import annotations

from typing import Iterable, Sequence

from stagevisor.supervisor.config import EdgeName


def edge_text(edge: EdgeName) -> str:
    return f"{edge[0]!r} -> {edge[1]!r}"


def names_text(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def listed_text(names: Sequence[str]) -> str:
    """`'a'`, `'a' and 'b'`, `'a', 'b' and 'c'`."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def fraction_text(value: float) -> str:
    return f"{round(value, 6):g}"
