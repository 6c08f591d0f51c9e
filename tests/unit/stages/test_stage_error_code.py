"""A StageError's `code`: what a stage may give (UPPER_SNAKE, at most 64 characters), checked when it raises."""

from __future__ import annotations

import pickle

import pytest

from stagevisor.stages.base import MAX_ERROR_CODE_CHARS, InvalidRequest, StageError, is_error_code, is_field_name


@pytest.mark.parametrize("code", ["X", "X_Y", "QWEN3_UNKNOWN_SPEAKER", "A" * MAX_ERROR_CODE_CHARS, "V2_0"])
def test_an_upper_snake_code_is_kept_beside_the_message(code):
    error = InvalidRequest("voice 'x' is not loaded", code=code)
    assert error.code == code and str(error) == "voice 'x' is not loaded"
    assert isinstance(error, StageError)


def test_without_a_code_the_error_reads_as_before():
    error = StageError("weights are still loading; retry")
    assert error.code is None and str(error) == "weights are still loading; retry"
    assert error.args == ("weights are still loading; retry",)


@pytest.mark.parametrize(
    "code",
    ["", "x_y", "Bad", "_X", "9X", "X-Y", "X Y", "X\n", "A" * (MAX_ERROR_CODE_CHARS + 1), "É", 7, b"X_Y"],
)
def test_anything_else_is_refused_when_the_stage_raises_it(code):
    with pytest.raises(ValueError, match=r"UPPER_SNAKE.*got"):
        StageError("text", code=code)
    assert not is_error_code(code)


def test_the_code_survives_pickling_as_the_error_does():
    error = pickle.loads(pickle.dumps(InvalidRequest("bad option", code="X_Y")))
    assert (type(error), error.code, str(error)) == (InvalidRequest, "X_Y", "bad option")


@pytest.mark.parametrize("field", ["voice", "reference_audio", "top_k", "_x", "noise.w", "a-b", "x" * 64])
def test_the_request_field_a_refusal_is_about_is_kept_beside_its_code(field):
    error = InvalidRequest("no such voice", code="X_Y", field=field)
    assert (error.field, error.code, str(error)) == (field, "X_Y", "no such voice")
    assert StageError("busy").field is None


@pytest.mark.parametrize("field", ["", "a b", "9x", "x\n", "x" * 65, "é", 7])
def test_a_field_that_is_no_request_fields_name_is_dropped_and_the_refusal_stays_a_refusal(field):
    """An unknown option's key is the client's text: a key no gateway checked (`stagevisor check --option 'a b=1'`)
    made the refusal a ValueError, which `check` reported as the stage breaking its contract."""
    error = InvalidRequest("unknown option", code="UNKNOWN_OPTION", field=field)
    assert (error.field, error.code, str(error)) == (None, "UNKNOWN_OPTION", "unknown option")
    assert not is_field_name(field)


def test_the_field_survives_pickling_as_the_code_does():
    error = pickle.loads(pickle.dumps(InvalidRequest("bad option", code="X_Y", field="top_k")))
    assert (error.field, error.code) == ("top_k", "X_Y")
