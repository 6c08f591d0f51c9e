"""read_upload (POST /v1/audio/voices) before any file is written: what it trusts of the request's headers."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.voices import MAX_UPLOAD_BYTES, read_upload


def upload(body: bytes, content_length: str) -> Request:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    headers = [
        (b"content-type", b"multipart/form-data; boundary=b"),
        (b"content-length", content_length.encode("latin-1")),
    ]
    return Request({"type": "http", "method": "POST", "path": "/v1/audio/voices", "headers": headers}, receive)


def test_a_declared_length_that_is_not_ascii_digits_is_not_trusted_and_the_form_still_read():
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_upload(upload(b"--b--\r\n", "\u00b2"), {}))
    assert (caught.value.status, caught.value.param) == (400, "name")


def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read():
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_upload(upload(b"", str(MAX_UPLOAD_BYTES + 1)), {}))
    assert (caught.value.status, caught.value.code) == (413, "audio_too_large")
