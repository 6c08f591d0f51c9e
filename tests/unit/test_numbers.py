"""whole_number reads ASCII digits only (not all `str.isdigit()` takes); plain writes numbers in full."""

from __future__ import annotations

import math

import pytest

from stagevisor.supervisor.numbers import decimal, plain, whole_number


@pytest.mark.parametrize("text, value", [("0", 0), ("7", 7), ("0042", 42), (str(2**70), 2**70)])
def test_ascii_digits_are_their_number(text, value):
    assert whole_number(text) == value


@pytest.mark.parametrize("text", ["", " 7", "7 ", "+7", "-7", "7_000", "7.0", "0x10", "²", "١٢", "７", "seven"])
def test_anything_else_is_none(text):
    assert whole_number(text) is None


@pytest.mark.parametrize(
    "number, text",
    [
        (4, "4"),
        (4.0, "4"),
        (0.25, "0.25"),
        (2**32 - 1, "4294967295"),
        (2**63 - 1, "9223372036854775807"),
        (1e7, "10000000"),
        (1e-3, "0.001"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e300, "1e+300"),
        (-2.5, "-2.5"),
        (float("inf"), "inf"),
    ],
)
def test_plain_writes_integers_in_full_and_floats_shortest(number, text):
    assert plain(number) == text


@pytest.mark.parametrize(
    "text, value", [("1.5", 1.5), ("-2", -2.0), ("1e-3", 1e-3), (" 0.25 ", 0.25), ("inf", math.inf)]
)
def test_decimal_reads_a_number_written_in_ascii(text, value):
    assert decimal(text) == value


@pytest.mark.parametrize("text", ["", "١", "٠.5", "１.5", "1_0", "1_000.5", "fast"])
def test_decimal_refuses_other_scripts_digits_and_digit_groups_that_float_reads(text):
    with pytest.raises(ValueError):
        decimal(text)
