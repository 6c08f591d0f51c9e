"""The request's text as every built-in voice's first stage checks it: present, not blank, not too long."""

from __future__ import annotations

from typing import Any

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS, InvalidRequest
from stagevisor.stages.codes import TEXT_EMPTY, TEXT_TOO_LONG

MAX_TEXT_CHARS = DEFAULT_MAX_TEXT_CHARS
"""Longest text one request may carry; longer texts should be split by the client."""


def validate_text(request: dict[str, Any], max_text_chars: int = MAX_TEXT_CHARS) -> str:
    """The request's text, or InvalidRequest when it is missing, blank or too long."""
    text = request.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("text must be a non-empty string", code=TEXT_EMPTY, field="text")
    if len(text) > max_text_chars:
        raise InvalidRequest(
            f"text is {len(text)} characters; at most {max_text_chars} are accepted per request",
            code=TEXT_TOO_LONG,
            field="text",
        )
    return text
