"""whole_number reads ASCII digits only (not all `str.isdigit()` takes); plain writes numbers in full;
seconds_problem refuses a number of seconds that is nan, infinite or out of range."""

from __future__ import annotations

import math

import pytest

from stagevisor.supervisor.numbers import decimal, integer_text, plain, seconds_problem, whole_number


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


@pytest.mark.parametrize("value", [0.001, 1.0, 1e9])
@pytest.mark.parametrize("zero", [False, True])
def test_a_finite_positive_number_of_seconds_is_accepted(value, zero):
    assert seconds_problem("--wait", value, zero=zero) is None


def test_zero_seconds_is_accepted_only_where_zero_is_allowed():
    assert seconds_problem("--wait", 0.0, zero=True) is None
    assert seconds_problem("--wait", 0.0, zero=False) == "--wait must be a finite number of seconds > 0, got 0.0"


@pytest.mark.parametrize("value, shown", [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf"), (-1.0, "-1.0")])
@pytest.mark.parametrize("zero, bound", [(False, "> 0"), (True, ">= 0")])
def test_nan_infinity_or_a_negative_number_of_seconds_is_refused_naming_the_option(value, shown, zero, bound):
    assert (
        seconds_problem("--wait", value, zero=zero) == f"--wait must be a finite number of seconds {bound}, got {shown}"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [("7", 7), (" 7 ", 7), ("+7", 7), ("-3", -3), ("7.0", 7), ("1e3", 1000), ("4294967295", 4294967295)],
)
def test_integer_text_reads_digits_and_a_whole_number_written_as_a_float(text, value):
    assert integer_text(text) == value


@pytest.mark.parametrize("text", ["7.5", "nan", "inf", "", "seven", "١٢", "1_0", "+", "7 7"])
def test_integer_text_refuses_fractions_and_what_is_no_number(text):
    assert integer_text(text) is None
