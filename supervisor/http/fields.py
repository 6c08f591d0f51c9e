"""A speech request's fields: those with a meaning here, which a model takes, and the checks of one field's value."""

from __future__ import annotations

import math
from typing import Any, Mapping

from stagevisor.supervisor.config import SpeechConfig
from stagevisor.supervisor.dataplane.limits import quote
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.errors import shown
from stagevisor.supervisor.numbers import plain

FIELDS = (
    "model",
    "input",
    "voice",
    "instructions",
    "response_format",
    "speed",
    "stream_format",
    "sample_rate",
    "language",
    "seed",
    "ref_audio",
    "ref_text",
)
"""Fields with a meaning here; any other field is a model option (e.g. noise_scale)."""


def accepted_fields(speech: SpeechConfig) -> list[str]:
    """The FIELDS a request to a model of `speech` may carry without a 400 for being there (GET /v1/models):
    reference audio only where it clones, `seed` where it takes one, `language` where it lists languages, `speed`
    where it has a speaking rate (elsewhere only 1, the default, passes).
    `instructions` stays: a model that does not follow them ignores or refuses them (`accepts.instructions`)."""
    refused = set()
    if not speech.clones:
        refused |= {"ref_audio", "ref_text"}
    if not speech.seed:
        refused.add("seed")
    if not speech.languages:
        refused.add("language")
    if not speech.speed:
        refused.add("speed")
    return [field for field in FIELDS if field not in refused]


REQUIRED_FIELDS = ("model", "input")
"""The fields a request must give; null on any other field is that field left out (its default)."""


def given_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a request gives: null on an optional field is that field not given (its default), as in
    OpenAI's API, whose SDKs and other clients send explicit nulls; null on a required field stays, to be
    refused as missing."""
    return {key: value for key, value in data.items() if value is not None or key in REQUIRED_FIELDS}


def string_field(data: Mapping[str, Any], name: str, default: str | None = None) -> str:
    """The string field `name` (`default` when not given); a 400 naming it when missing or not a string."""
    value = data.get(name, default)
    if value is None:
        raise ApiError(400, f"'{name}' is required", param=name, code="missing_required_parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string, got {json_type(value)}", param=name, code="invalid_type")
    return value


def json_type(value: Any) -> str:
    """A JSON value's type as a message names it (`a string`, `an array`)."""
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def choice_field(data: Mapping[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    """The string field `name`, one of `choices`; a 400 naming them otherwise."""
    value = string_field(data, name, default)
    if value not in choices:
        raise ApiError(
            400,
            f"{name} {quote(value)} is not supported; use one of {', '.join(choices)}",
            param=name,
            code="invalid_value",
        )
    return value


def integral(value: Any) -> bool:
    """Whether a JSON value is an integer: an int, or a float with no fraction (`30.0`, as JavaScript and many
    JSON encoders write a whole number they hold as a float). gRPC's options are strings, and the stages read
    "30.0" as 30 too (`numbers.integer_text`); a bool is no integer."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def number_field(data: Mapping[str, Any], name: str, low: float, high: float, *, integer: bool = False) -> Any:
    """The number field `name` (None when not given), from `low` to `high`; a 400 naming it otherwise."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, float) and math.isinf(value):  # 1e400 in the JSON: no integer either, but say why
        raise ApiError(400, out_of_range(name, value, plain(low), plain(high)), param=name, code="invalid_value")
    if isinstance(value, bool) or not (integral(value) if integer else isinstance(value, (int, float))):
        what = "an integer" if integer else "a number"
        raise ApiError(400, f"'{name}' must be {what}, got {json_type(value)}", param=name, code="invalid_type")
    if not low <= value <= high:
        raise ApiError(
            400,
            out_of_range(name, value, plain(low), plain(high)),
            param=name,
            code="invalid_value",
        )
    return int(value) if integer else value


def out_of_range(name: str, value: float, low: str, high: str) -> str:
    """Why `value` is refused for `name`. JSON has no infinity: an infinite float is a number the client wrote
    past what a 64-bit float holds (1e400, read as inf), so the message says that rather than show `inf`."""
    if isinstance(value, float) and math.isinf(value):
        return (
            f"{name} must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use {low} to {high}"
        )
    return f"{name} {shown(value)} is out of range; use {low} to {high}"
