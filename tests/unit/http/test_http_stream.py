"""The WebSocket stream: its sentence splitter (pieces of text in, sentences out as early as they are sure), and a
message it refuses."""

from __future__ import annotations

import pytest

from stagevisor.supervisor.http.stream import SentenceSplitter


def test_a_sentence_is_released_once_the_text_after_its_end_has_started():
    splitter = SentenceSplitter()
    assert splitter.push("Hello th") == []
    assert splitter.push("ere.") == []  # "there.5" or "there. Next" are still possible
    assert splitter.push(" How") == ["Hello there."]
    assert splitter.push(" are you? I") == ["How are you?"]
    assert splitter.flush() == ["I"] and splitter.flush() == []


def test_newlines_and_closing_quotes_end_sentences():
    splitter = SentenceSplitter()
    assert splitter.push('He said "stop." Then\nthe end') == ['He said "stop."', "Then"]
    assert splitter.flush() == ["the end"]


def test_a_run_on_text_is_cut_at_a_space_once_it_is_long():
    splitter = SentenceSplitter(max_chars=20)
    assert splitter.push("one two three four five six") == ["one two three four"]
    assert splitter.flush() == ["five six"]


def test_a_decimal_number_is_not_a_sentence_end():
    splitter = SentenceSplitter()
    assert splitter.push("It costs 3.5 dollars. And") == ["It costs 3.5 dollars."]


@pytest.mark.parametrize(
    "text, sentences",
    [
        ("Dr. Smith arrived. He sat. Then", ["Dr. Smith arrived.", "He sat."]),
        ("J. K. Rowling wrote it. Then", ["J. K. Rowling wrote it."]),
        ("Use a tool, e.g. a hammer. Or", ["Use a tool, e.g. a hammer."]),
        ("She moved to the U.S. Army base. Yes", ["She moved to the U.S. Army base."]),
        ("Apples, pears, etc. and plums. End", ["Apples, pears, etc. and plums."]),
        ("It was late. and then. Then", ["It was late. and then."]),  # a lowercase word after: not an end yet
        ("Wait... Yes! No? OK", ["Wait...", "Yes!", "No?"]),  # only a single period is read with care
        ("I said no. The sun. We sat. Go", ["I said no.", "The sun.", "We sat."]),  # words, not abbreviations
    ],
)
def test_a_period_after_an_abbreviation_or_an_initial_is_not_a_sentence_end(text, sentences):
    """`Dr. Smith arrived.` was spoken as two requests, `Dr.` and `Smith arrived.`: a pause and a prosody break in
    the middle of a sentence."""
    assert SentenceSplitter().push(text) == sentences


def test_a_cjk_full_stop_ends_a_sentence_without_a_space_after_it():
    splitter = SentenceSplitter()
    assert splitter.push("\u4e2d\u6587\u53e5\u5b50\u3002\u4e0b\u4e00\u53e5\uff01\u518d") == [
        "\u4e2d\u6587\u53e5\u5b50\u3002",
        "\u4e0b\u4e00\u53e5\uff01",
    ]
    assert splitter.flush() == ["\u518d"]


def test_a_piece_with_no_letter_or_digit_is_not_a_sentence():
    splitter = SentenceSplitter()
    assert splitter.push("Great job! \U0001f642. --- ... Next 2. And") == ["Great job!", "Next 2."]
    assert splitter.flush() == ["And"]
    assert splitter.push("\u4f60\u597d\u3002 ok") == ["\u4f60\u597d\u3002"]  # letters of any script are letters
    assert splitter.flush() == ["ok"]
    assert splitter.push("\U0001f642\U0001f642") == [] and splitter.flush() == []


def session_of_bad_messages():
    """An app serving the WebSocket session at /stream whose messages never reach the request checks (each test
    sends one the session refuses first)."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.stream import speech_session

    async def parse(data):
        raise AssertionError("a bad message never reaches the request checks")

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits())
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    return Starlette(routes=[WebSocketRoute("/stream", stream)])


def test_a_message_nested_too_deep_to_parse_ends_the_session_as_invalid_json_not_a_server_error():
    """`[[[[...` under the message size limit used to raise RecursionError out of the app: a traceback in the
    daemon log and a connection dropped without a close frame."""
    from starlette.testclient import TestClient

    from stagevisor.supervisor.http.stream import CLOSE_POLICY

    with TestClient(session_of_bad_messages()).websocket_connect("/stream") as websocket:
        websocket.send_text("[" * 100_000)
        error = websocket.receive_json()
        closed = websocket.receive()
    assert error["type"] == "error" and error["error"]["code"] == "invalid_message"
    assert closed["type"] == "websocket.close" and closed["code"] == CLOSE_POLICY


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"type": "text", "type": "end"}', "a message gives 'type' twice; give each field once"),
        ('{"type": "text", "text": NaN}', "a message is not valid JSON: NaN is not a JSON number"),
    ],
)
def test_a_message_is_read_by_a_body_s_rules(text, said):
    """A message's JSON was read by Python's defaults: a key given twice kept the last, and NaN was a number."""
    from starlette.testclient import TestClient

    with TestClient(session_of_bad_messages()).websocket_connect("/stream") as websocket:
        websocket.send_text(text)
        error = websocket.receive_json()["error"]
    assert (error["code"], error["message"]) == ("invalid_message", said)


def test_an_unexpected_error_ends_the_session_with_its_class_and_a_request_id_never_its_text(caplog):
    """Raised out of the session, it used to drop the connection with a bare 1011 and no id to look up."""
    import logging
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.stream import CLOSE_ERROR, speech_session

    async def parse(data):
        raise OSError("/srv/stagevisor/secret-token is unreadable")

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits(), metrics=None)
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    app = Starlette(routes=[WebSocketRoute("/stream", stream)])
    with caplog.at_level(logging.ERROR, logger="stagevisor.http"):
        with TestClient(app).websocket_connect("/stream") as websocket:
            websocket.send_json({"type": "text", "text": "Hello there. And"})
            error = websocket.receive_json()
            closed = websocket.receive()
    message = error["error"]["message"]
    request_id = message.rpartition("(request ")[2].rstrip(")")
    assert message == f"the daemon failed with OSError; the daemon log has the details (request {request_id})"
    assert error["error"]["code"] == "internal_error" and len(request_id) == 32
    assert closed["type"] == "websocket.close" and closed["code"] == CLOSE_ERROR and closed["reason"] == message
    assert f"request {request_id}: WebSocket session failed" in caplog.text and "secret-token" in caplog.text


def test_a_close_reason_is_cut_to_123_bytes_of_utf8_on_a_character_boundary():
    """A refusal in another script: cut at 120 characters it was up to 480 bytes, past the 123 a close frame
    holds; a client's WebSocket library refuses such a frame ("control frame too long") and never sees the
    reason."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.errors import ApiError
    from stagevisor.supervisor.http.stream import CLOSE_POLICY, speech_session

    refusal = "la voix « é » n'est pas chargée ; " + "語" * 200

    async def parse(data):
        raise ApiError(400, refusal, code="invalid_value")

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits(), metrics=None)
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    app = Starlette(routes=[WebSocketRoute("/stream", stream)])
    with TestClient(app).websocket_connect("/stream") as websocket:
        websocket.send_json({"type": "text", "text": "Bonjour. Et"})
        error = websocket.receive_json()
        closed = websocket.receive()
    reason = closed["reason"]
    assert error["error"]["message"] == refusal and closed["code"] == CLOSE_POLICY
    assert 120 <= len(reason.encode()) <= 123 and refusal.startswith(reason)


@pytest.mark.parametrize(
    ("status", "close"),
    [(400, 1008), (404, 1008), (429, 1013), (503, 1013), (500, 1011), (504, 1011)],
)
def test_a_refusal_closes_the_session_with_the_code_a_client_decides_retries_by(status, close):
    """Before: every refusal but a 429 closed with 1008 (a bad message), so a client that reads the close code
    gave up on a worker that was merely down (503: retry later) or a server fault (1011)."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.errors import ApiError
    from stagevisor.supervisor.http.stream import speech_session

    async def parse(data):
        raise ApiError(status, f"refused with {status}", code="refused")

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits(), metrics=None)
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    app = Starlette(routes=[WebSocketRoute("/stream", stream)])
    with TestClient(app).websocket_connect("/stream") as websocket:
        websocket.send_json({"type": "start", "voice": "heart"})  # checked as it arrives
        error = websocket.receive_json()
        closed = websocket.receive()
    assert error["error"]["message"] == f"refused with {status}"
    assert closed["type"] == "websocket.close" and closed["code"] == close


def test_null_on_a_field_of_the_start_message_is_the_field_not_given():
    """`"response_format": null` in start ended the session (1008: "the stream sends pcm"), as a POST's null did."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.errors import ApiError
    from stagevisor.supervisor.http.stream import PROBE_INPUT, speech_session

    parsed = []

    async def parse(data):
        parsed.append(data)
        raise ApiError(400, "seen", code="invalid_value")  # ends the session once the start's fields are in

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits(), metrics=None)
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    nulls = dict.fromkeys(("model", "voice", "response_format", "stream_format", "instructions", "sample_rate"))
    app = Starlette(routes=[WebSocketRoute("/stream", stream)])
    with TestClient(app).websocket_connect("/stream") as websocket:
        websocket.send_json({"type": "start", **nulls})
        error = websocket.receive_json()
    assert error["error"]["message"] == "seen"
    assert parsed == [{"model": "demo", "response_format": "pcm", "input": PROBE_INPUT}]


def test_a_lone_surrogate_in_a_text_message_is_refused_naming_text():
    """Before: refused with the first sentence holding it, as `input`, a field the session never sent."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient

    from stagevisor.supervisor.dataplane.limits import RequestLimits
    from stagevisor.supervisor.http.stream import CLOSE_POLICY, speech_session

    async def parse(data):
        return None, None  # the start message passes; a sentence never gets this far

    async def stream(websocket):
        gateway = SimpleNamespace(limits=RequestLimits(), metrics=None)
        await speech_session(websocket, parse, gateway, lambda served: 24000, "demo")

    app = Starlette(routes=[WebSocketRoute("/stream", stream)])
    with TestClient(app).websocket_connect("/stream") as websocket:
        websocket.send_text('{"type": "text", "text": "Hi \\ud800 there. And"}')
        error = websocket.receive_json()["error"]
        closed = websocket.receive()
    assert (error["param"], error["code"]) == ("text", "invalid_message")
    assert "text is not valid Unicode: a lone surrogate (U+D800)" in error["message"]
    assert closed["code"] == CLOSE_POLICY


@pytest.mark.parametrize(
    "status, code, close",
    [
        (400, "invalid_value", 1008),
        (429, "busy", 1013),
        (503, "unavailable", 1013),
        (503, "group_failed", 1011),
        (500, "internal", 1011),
    ],
)
def test_a_session_closes_with_the_code_its_error_calls_for(status, code, close):
    """A FAILED group's refusal closed with 1013 (try again later), where no retry passes until it is restarted."""
    from stagevisor.supervisor.http.errors import ApiError
    from stagevisor.supervisor.http.stream import close_code

    assert close_code(ApiError(status, "m", code=code)) == close


@pytest.mark.parametrize(
    "message, said",
    [
        ({"text": "hi"}, "a message needs a 'type': start (first), text, end or cancel"),  # was "message type None"
        ({"type": "x" * 5000}, "is not one of start (first), text, end or cancel"),
    ],
)
def test_a_message_of_no_or_an_unknown_type_is_refused_saying_what_types_there_are(message, said):
    from starlette.testclient import TestClient

    with TestClient(session_of_bad_messages()).websocket_connect("/stream") as websocket:
        websocket.send_json(message)
        error = websocket.receive_json()["error"]
    assert said in error["message"] and len(error["message"]) < 200  # an unknown type is shown cut short
