"""Whole numbers as an operator or a client writes them: ASCII digits, nothing else.

`str.isdigit()` is true for digits `int()` cannot read (a superscript "²")
and for other scripts' digits that it does read ("١٢" is 12), so a check
with it either fails later with Python's own message or accepts what nobody
meant. Counts, ports, pids, sizes and seeds read from text go through
`whole_number`.
"""

from __future__ import annotations


def whole_number(text: str) -> int | None:
    """`text` as a non-negative integer when it is ASCII digits only (no sign, space or `_`), else None."""
    return int(text) if text.isascii() and text.isdigit() else None
