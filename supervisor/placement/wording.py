"""How placement messages name stages, edges and fractions: the wording every placement rule shares. Pure."""

from __future__ import annotations

from typing import Iterable

from stagevisor.supervisor.config import EdgeName


def edge_text(edge: EdgeName) -> str:
    return f"{edge[0]!r} -> {edge[1]!r}"


def names_text(names: Iterable[str]) -> str:
    return ", ".join(repr(n) for n in names)


def fraction_text(value: float) -> str:
    return f"{round(value, 6):g}"
