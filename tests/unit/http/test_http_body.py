"""A request's JSON body: a declared length not trusted blindly, and valid JSON the parser cannot take refused."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from stagevisor.supervisor.http.body import parse_json_object, read_json_body
from stagevisor.supervisor.http.errors import ApiError


def json_request(body: bytes, content_length: str) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [(b"content-type", b"application/json"), (b"content-length", content_length.encode("latin-1"))]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


def test_a_declared_length_that_is_not_ascii_digits_is_not_trusted_and_the_body_still_read():
    assert asyncio.run(read_json_body(json_request(b'{"a": 1}', "\u00b2"))) == {"a": 1}
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_json_body(json_request(b"{}", "99"), limit=10))
    assert (caught.value.status, caught.value.code) == (413, "request_too_large")


@pytest.mark.parametrize(
    "body, message",
    [
        (
            b'{"model": "demo", "input": "Hi.", "seed": ' + b"9" * 5000 + b"}",
            "the body holds an integer of 5000 digits; no field takes one that long",
        ),
        (b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "the body nests arrays or objects too deeply"),
        # Python's parser kept the last silently (a query parameter given twice was already a 400).
        (
            b'{"model": "demo", "input": "Hi.", "voice": "a", "voice": "b"}',
            "the body gives 'voice' twice; give each field once",
        ),
    ],
    ids=["long-integer", "deep-nesting", "duplicate-key"],
)
def test_valid_json_the_parser_cannot_take_is_refused_saying_what_to_change(body, message):
    """Both are JSON. Before: "the body is not valid JSON: Exceeds the limit (4300 digits) for integer string
    conversion ...; use sys.set_int_max_str_digits() to increase the limit" (advice for the server's Python, not
    for the client) and "...: maximum recursion depth exceeded while decoding a JSON array from a unicode string"."""
    with pytest.raises(ApiError) as refused:
        parse_json_object(body)
    assert (refused.value.status, refused.value.code) == (400, "invalid_json")
    assert refused.value.message == message


@pytest.mark.parametrize(
    "body, message",
    [
        (b"[1]", "the body must be a JSON object, got an array"),
        (b'"Hello."', "the body must be a JSON object, got a string"),
        (b"null", "the body must be a JSON object, got null"),
    ],
)
def test_a_body_that_is_not_an_object_is_named_by_its_json_type(body, message):
    """It was named by Python's type ("got list", "got str", "got NoneType"), which the client never sent."""
    with pytest.raises(ApiError) as refused:
        parse_json_object(body)
    assert refused.value.message == message


def test_a_body_with_no_content_type_is_told_it_has_none():
    """It was told "got 'none'", as if it had sent the media type `none`."""

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_json_body(request))
    assert (refused.value.status, refused.value.message) == (
        415,
        "Content-Type must be application/json, the request has none",
    )
