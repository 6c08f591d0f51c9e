"""whole_number: ASCII digits only, whatever else `str.isdigit()` or `int()` would take."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.numbers import whole_number


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), ("0042", 42), (str(2**70), 2**70)])
def test_ascii_digits_are_their_number(text, value):
    assert whole_number(text) == value


@pytest.mark.parametrize("text", ["", " 7", "7 ", "+7", "-7", "7_000", "7.0", "0x10", "²", "١٢", "７", "seven"])
def test_anything_else_is_none(text):
    assert whole_number(text) is None
