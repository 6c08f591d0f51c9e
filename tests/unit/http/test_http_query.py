"""GET /v1/audio/speech's query read as a request body: text fields as text, JSON scalars as JSON, nothing twice."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from starlette.requests import Request

from stagevisor.supervisor.http.query import query_fields
from stagevisor.supervisor.http.errors import ApiError


def get(pairs: list[tuple[str, str]]) -> Request:
    scope = {"type": "http", "method": "GET", "path": "/v1/audio/speech", "headers": []}
    return Request({**scope, "query_string": urlencode(pairs).encode()})


def test_text_fields_stay_text_and_other_fields_read_json_scalars():
    fields = query_fields(
        get([("input", "42"), ("speed", "1.5"), ("seed", "7"), ("stream", "true"), ("x", "null"), ("voice", "true")]),
        "demo",
    )
    assert fields == {
        "model": "demo",
        "input": "42",
        "speed": 1.5,
        "seed": 7,
        "stream": True,
        "x": None,
        "voice": "true",
    }


@pytest.mark.parametrize("raw", ["fast", "NaN", "Infinity", '{"a": 1}', "[1]", '1, "model": "other"', ""])
def test_anything_but_a_json_scalar_stays_the_text_it_is(raw):
    assert query_fields(get([("speed", raw)]), "demo")["speed"] == raw


def test_a_value_nested_too_deep_for_json_stays_text_not_a_server_error():
    """`?speed=[[[[...` (3000 brackets fit in a URL) used to raise RecursionError: a 500 and a traceback."""
    assert query_fields(get([("speed", "[" * 3000)]), "demo")["speed"] == "[" * 3000


def test_a_parameter_given_twice_is_refused_naming_it():
    with pytest.raises(ApiError) as caught:
        query_fields(get([("input", "Hello"), ("input", "World")]), "demo")
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, "input", "invalid_value")
    assert caught.value.message == "query parameter 'input' is given more than once"


@pytest.mark.parametrize("query", [b"input=%ED%A0%80", b"input=ok&voice=%FF", b"x%C3=1"])
def test_a_parameter_whose_escapes_are_not_utf8_is_refused_naming_it(query):
    """Before: decoded leniently to U+FFFD, which the model was then asked to speak (or refused, naming no field)."""
    scope = {"type": "http", "method": "GET", "path": "/v1/audio/speech", "headers": [], "query_string": query}
    with pytest.raises(ApiError) as refused:
        query_fields(Request(scope), "demo")
    error = refused.value
    assert error.status == 400 and error.code == "invalid_value"
    assert error.param == query.split(b"&")[-1].split(b"=")[0].decode("latin-1").replace("%C3", "\ufffd")
    assert "is not UTF-8 text" in error.message


def test_the_query_reads_as_starlette_reads_it():
    raw = b"input=Hello+there%2C+%C3%A9t%C3%A9&empty=&flag&speed=1.5&&voice=a%26b"
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": raw})
    fields = query_fields(request, "demo")
    expected = {key: value for key, value in request.query_params.multi_items()}
    assert fields == {"model": "demo", **expected, "speed": 1.5}
