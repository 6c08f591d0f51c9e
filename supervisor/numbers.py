"""Numbers as an operator or a client writes them: whole numbers read from ASCII digits only, and shown in full.

`str.isdigit()` is true for digits `int()` cannot read (a superscript "²")
and for other scripts' digits that it does read ("١٢" is 12), so a check
with it either fails later with Python's own message or accepts what nobody
meant. Counts, ports, pids, sizes and seeds read from text go through
`whole_number`, fractional numbers (speeds, scales) through `decimal`.
`plain` writes a range's ends in messages: `f"{x:g}"` keeps six digits, so
a seed's limit 4294967295 would read 4.29497e+09. `seconds_problem` checks a
command-line option's number of seconds, nan and infinity included.
"""

from __future__ import annotations

import math

EXACT_FLOAT = 2**53
"""Integral floats below this are written as integers; beyond it a float's digits are not all its own."""


def whole_number(text: str) -> int | None:
    """`text` as a non-negative integer when it is ASCII digits only (no sign, space or `_`), else None."""
    return int(text) if text.isascii() and text.isdigit() else None


def integer_text(text: str) -> int | None:
    """`text` as an integer: ASCII digits with an optional sign, or a whole number as a JSON client writes one it
    holds as a float (`30.0`, `1e3`); None for a fraction, infinity, nan or no number. A request's integer options
    and seeds are read so, whatever the model."""
    text = text.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isascii() and digits.isdigit():
        return int(text)
    try:
        number = decimal(text)
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def decimal(text: str) -> float:
    """`text` as a number written in ASCII (`1.5`, `-2`, `1e-3`, `nan`); ValueError otherwise.

    float() also reads other scripts' digits ("١" is 1.0) and digit groups ("1_0" is 10.0), which no option
    means: a speed or a scale read from text goes through this instead.
    """
    if not text.isascii() or "_" in text:
        raise ValueError(f"could not convert string to float: {text!r}")
    return float(text)


def plain(number: float) -> str:
    """`number` as a person writes it: an integer in full (4, 4294967295), any other float in its shortest form."""
    if isinstance(number, int):
        return str(number)
    if math.isfinite(number) and number.is_integer() and abs(number) < EXACT_FLOAT:
        return str(int(number))
    return repr(number)


def seconds_problem(option: str, value: float, *, zero: bool) -> str | None:
    """Why `value` cannot be `option`'s number of seconds (nan, infinite, negative, or 0 unless `zero` allows it),
    as the CLI says it after "error: "; None when it can. Written as the range the value must lie in: every
    comparison with nan is false, so a check like `value < 0` lets nan through."""
    if (0 <= value if zero else 0 < value) and value < math.inf:
        return None
    return f"{option} must be a finite number of seconds {'>=' if zero else '>'} 0, got {value}"


def counted(count: float, noun: str) -> str:
    """`1 request`, `2 requests`, `0.5 GPUs`: a count and its noun, in the number it takes (nouns with a plain
    plural); the count written as `plain` writes it."""
    return f"{plain(count)} {noun}{'' if count == 1 else 's'}"
