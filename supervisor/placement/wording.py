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


FRACTION_DIGITS = 12
"""Significant digits a GPU memory fraction is shown and reported with: every digit of a fraction an operator
writes (0.7000001 is not 0.7, so a total just over the limit never reads as the limit), none of the binary
rounding of a sum (0.1 + 0.2 + 0.7 is 1.0000000000000002, shown as 1)."""


def fraction_value(value: float) -> float:
    """A fraction or a sum of fractions as the plan reports it: rounded to FRACTION_DIGITS significant digits."""
    return float(fraction_text(value))


def fraction_text(value: float) -> str:
    return f"{value:.{FRACTION_DIGITS}g}"
