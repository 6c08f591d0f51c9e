"""A request's JSON body, read strictly: its content type and size, then one JSON object with each key once."""

from __future__ import annotations

import json
import sys
from typing import Any

from starlette.requests import Request

from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.fields import json_type
from stagevisor.supervisor.errors import shown
from stagevisor.supervisor.numbers import whole_number

MAX_BODY_BYTES = 6 * 1024 * 1024
"""Largest JSON body: the longest input plus a base64 `ref_audio` (4 MiB for a 3 MiB file) fit in it."""


async def read_json_body(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object; ApiError 415 (content type or a content encoding), 413 (too large) or 400 (not a
    JSON object)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        given = f"got {media_type!r}" if media_type else "the request has none"
        raise ApiError(415, f"Content-Type must be application/json, {given}", code="unsupported_media_type")
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # a compressed body would read as JSON that does not decode
        raise ApiError(
            415,
            f"Content-Encoding {encoding!r} is not accepted: send the JSON body uncompressed",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length")
    size = None if declared is None else whole_number(declared)
    if size is not None and size > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="request_too_large")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    return parse_json_object(bytes(body))


class _Untakeable(ValueError):
    """JSON the parser cannot take: `str(error)` says why, after what was parsed (`the body`, `a message`)."""


def parse_json_object(body: bytes | str, what: str = "the body") -> dict[str, Any]:
    """A JSON object from text; ApiError 400 otherwise (NaN and Infinity are not JSON), its message naming the text
    as `what`."""
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_int=_integer, object_pairs_hook=_unique_keys)
    except _Untakeable as error:
        raise ApiError(400, f"{what} {error}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, f"{what} nests arrays or objects too deeply", code="invalid_json") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError(400, f"{what} is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"{what} must be a JSON object, got {json_type(data)}", code="invalid_json")
    return data


def _integer(text: str) -> int:
    # Python refuses to convert more digits than this (a guard against quadratic int parsing); its error
    # tells the client to call sys.set_int_max_str_digits().
    digits = len(text.lstrip("-"))
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # 0: no limit (and before Python 3.10.7)
    if limit and digits > limit:
        raise _Untakeable(f"holds an integer of {digits} digits; no field takes one that long")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys each come once: a key given twice is refused, as a query parameter given twice is (the
    JSON parser would keep the last silently, and another parser the first)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Untakeable(f"gives {shown(key)} twice; give each field once")
        seen.add(key)
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
