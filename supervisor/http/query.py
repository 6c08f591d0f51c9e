"""GET /v1/audio/speech's query string read as a request body: strings, JSON scalars, each parameter once."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

from starlette.requests import Request

from stagevisor.supervisor.http.errors import ApiError

TEXT_QUERY_FIELDS = (
    "model",
    "input",
    "voice",
    "instructions",
    "response_format",
    "stream_format",
    "language",
    "ref_text",
)
"""GET /v1/audio/speech parameters that stay strings; the others are read as JSON numbers and booleans."""


def query_fields(request: Request, default_model: str) -> dict[str, Any]:
    """GET /v1/audio/speech's query as a request body: numbers and booleans read as JSON, the model defaulted.

    A parameter given twice is refused (which one was meant is not ours to guess), and so is one whose
    %-escapes are not UTF-8 (`input=%ED%A0%80`, a lone surrogate), naming it; the lenient decoding of
    `request.query_params` would have turned it into U+FFFD and spoken that.
    """
    data: dict[str, Any] = {"model": default_model}
    given: set[str] = set()
    for key, value in _query_items(request.scope.get("query_string", b"")):
        if key in given:
            raise ApiError(400, f"query parameter {key!r} is given more than once", param=key, code="invalid_value")
        given.add(key)
        data[key] = value if key in TEXT_QUERY_FIELDS else _query_value(value)
    return data


def _query_items(query: bytes) -> list[tuple[str, str]]:
    """The query's (name, value) pairs in order, as Starlette reads them, but strict about UTF-8."""
    items: list[tuple[str, str]] = []
    for pair in query.decode("latin-1").split("&"):
        try:
            items += parse_qsl(pair, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            name = unquote_plus(pair.partition("=")[0], errors="replace")
            raise ApiError(
                400,
                f"query parameter {name!r} is not UTF-8 text once its %-escapes are decoded",
                param=name,
                code="invalid_value",
            ) from None
    return items


def _query_value(text: str) -> Any:
    """A number, a boolean or null as JSON reads it; anything else stays the text it is."""
    try:
        value = json.loads(text, parse_constant=lambda name: text)  # NaN and Infinity are not JSON numbers
    except (ValueError, RecursionError):  # "[[[[..." nested past Python's recursion limit is text too
        return text
    return value if value is None or isinstance(value, (bool, int, float)) else text
