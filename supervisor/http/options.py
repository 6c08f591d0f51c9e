"""A request's model options: the fields beyond FIELDS, checked against what the model declares, sent as strings."""

from __future__ import annotations

import math
from typing import Any, Mapping

from stagevisor.supervisor.config import OptionSpec
from stagevisor.supervisor.dataplane.limits import quote
from stagevisor.supervisor.dataplane.synthesis import OPTION_KEY
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.fields import FIELDS, integral, json_type, out_of_range
from stagevisor.supervisor.numbers import plain


def model_options(data: Mapping[str, Any], declared: Mapping[str, OptionSpec] | None) -> dict[str, str]:
    """Fields beyond FIELDS are model options: checked against the model's declaration, sent as strings."""
    options: dict[str, str] = {}
    for key, value in data.items():
        if key in FIELDS:
            continue
        if key == "stream" and declared is not None and key not in declared:  # the chat API's, sent here too
            raise ApiError(
                400,
                "unknown field 'stream': the speech API always streams the audio as it is made; "
                'for events, send "stream_format": "sse"',
                param=key,
                code="unknown_parameter",
            )
        if not OPTION_KEY.match(key):
            raise ApiError(
                400,
                f"unknown field {quote(key)}; extra fields are model options named with letters, digits, '_', '.', '-'",
                param=key,
                code="unknown_parameter",
            )
        if declared is not None and key not in declared:
            accepted = ", ".join(sorted(declared)) or "none"
            raise ApiError(
                400,
                f"unknown field {key!r}; this model's options are: {accepted} (GET /v1/models)",
                param=key,
                code="unknown_parameter",
            )
        options[key] = _option_value(key, value, declared[key] if declared is not None else None)
    return options


def _option_value(key: str, value: Any, spec: OptionSpec | None) -> str:
    if spec is not None:
        _check_option(key, value, spec)
        if spec.type == "integer":
            return str(int(value))  # 30.0 goes to the stage as "30": every stage reads a whole number so
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ApiError(400, f"option {key!r} must be finite", param=key, code="invalid_value")
        return repr(value)
    if isinstance(value, str):
        return value
    raise ApiError(
        400,
        f"option {key!r} must be a string, number or boolean, got {json_type(value)}",
        param=key,
        code="invalid_type",
    )


def _check_option(key: str, value: Any, spec: OptionSpec) -> None:
    kinds: dict[str, tuple[type, ...]] = {
        "number": (int, float),
        "integer": (int, float),  # a float only without a fraction (`integral`)
        "boolean": (bool,),
        "string": (str,),
    }
    low = "-inf" if spec.minimum is None else plain(spec.minimum)
    high = "inf" if spec.maximum is None else plain(spec.maximum)
    if spec.type in ("number", "integer") and isinstance(value, float) and math.isinf(value):  # 1e400 in the JSON
        raise ApiError(400, out_of_range(f"option {key}", value, low, high), param=key, code="invalid_value")
    if (
        (isinstance(value, bool) and spec.type != "boolean")
        or not isinstance(value, kinds[spec.type])
        or (spec.type == "integer" and not integral(value))
    ):
        raise ApiError(
            400, f"option {key!r} must be of type {spec.type}, got {json_type(value)}", param=key, code="invalid_type"
        )
    if spec.type in ("number", "integer") and isinstance(value, (int, float)):  # it is, after the check above
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ApiError(400, out_of_range(f"option {key}", value, low, high), param=key, code="invalid_value")
