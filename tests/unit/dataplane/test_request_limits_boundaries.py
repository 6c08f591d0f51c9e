"""Per-request limits at their boundaries: the documented defaults, field lengths, control characters, the
quoting of rejected values, a peer's share of a request table, audio seconds, the deadline and the idle timeout."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from stagevisor.supervisor.dataplane.limits import (
    ECHO_CHARS,
    PEER_SHARE,
    InvalidSynthesisRequest,
    LimitExceeded,
    RequestGuard,
    RequestLimits,
    audio_seconds,
    check_request_fields,
    per_peer_cap,
    quote,
)
from tests.fakes import FakeClock


def refused(request: dict) -> InvalidSynthesisRequest:
    with pytest.raises(InvalidSynthesisRequest) as caught:
        check_request_fields(request)
    return caught.value


def test_the_default_limits_are_the_ones_serve_documents():
    assert RequestLimits() == RequestLimits(
        max_audio_seconds=600.0, request_timeout=300.0, stream_idle_timeout=60.0, pipeline_idle_timeout=120.0
    )


def test_limits_are_immutable_values():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RequestLimits().request_timeout = 1.0  # type: ignore[misc]


def test_the_pipeline_idle_timeout_must_be_positive_too():
    with pytest.raises(ValueError, match="--pipeline-idle-timeout must be > 0 seconds, got -1"):
        RequestLimits(pipeline_idle_timeout=-1)


def test_a_voice_name_is_at_most_128_characters():
    check_request_fields({"text": "Hi.", "voice": "v" * 128})
    error = refused({"text": "Hi.", "voice": "v" * 129})
    assert (str(error), error.field) == ("voice has 129 characters; a voice name has at most 128", "voice")


def test_a_reference_transcript_is_at_most_2000_characters():
    check_request_fields({"text": "Hi.", "reference_transcript": "t" * 2000})
    error = refused({"text": "Hi.", "reference_transcript": "t" * 2001})
    assert str(error) == "reference_transcript has 2001 characters; the limit is 2000"
    assert error.field == "reference_transcript"


@pytest.mark.parametrize(
    "char", ["\x00", "\x08", "\x0b", "\x0c", "\x0e", "\x1f", "\x7f", "\x80", "\x84", "\x86", "\x9f"]
)  # C1 (U+0080-U+009F but NEL) passed: `"hi \u0080 there"` reached the front end
def test_control_characters_are_refused_at_each_end_of_their_ranges(char):
    error = refused({"text": f"Hi{char}."})
    assert str(error) == f"text contains the control character {char!r} at position 2; remove it"


@pytest.mark.parametrize("char", ["\t", "\n", "\r", "\x85", " ", "~", "\u00a0", "\u00e9"])
def test_tabs_line_breaks_and_printable_characters_are_text(char):
    check_request_fields({"text": f"Hi{char}there."})


def test_a_rejected_value_is_quoted_whole_up_to_40_characters_and_cut_with_an_ellipsis_beyond():
    assert ECHO_CHARS == 40
    assert quote("q" * 40) == repr("q" * 40)
    assert quote("q" * 41) == repr("q" * 40 + "...")
    assert quote("") == "''"


@pytest.mark.parametrize("table, cap", [(1, 1), (2, 1), (3, 1), (10, 5), (64, 32), (65, 32)])
def test_one_peer_may_hold_half_a_request_table_and_at_least_one_place(table, cap):
    assert PEER_SHARE == 0.5
    assert per_peer_cap(table) == cap


@pytest.mark.parametrize(
    "chunk, seconds",
    [
        ({"audio": [0.0] * 3, "sample_rate": 1}, 3.0),
        ({"audio": [0.0] * 8000, "sample_rate": 16000}, 0.5),
        ({"audio": [0.0] * 10, "sample_rate": 0}, 0.0),
        ({"audio": [0.0] * 10, "sample_rate": -16000}, 0.0),
        ({"audio": [0.0] * 10, "sample_rate": "fast"}, 0.0),
        ({"audio": [0.0] * 10}, 0.0),
        ({"sample_rate": 16000}, 0.0),
        ({"audio": 5, "sample_rate": 16000}, 0.0),
        ("text", 0.0),
    ],
)
def test_audio_seconds_are_samples_over_a_positive_rate_and_zero_for_anything_else(chunk, seconds):
    assert audio_seconds(chunk) == seconds


class Chunks:
    """An async iterator over `items` that counts how many were asked for."""

    def __init__(self, *items) -> None:
        self.items = list(items)
        self.asked = 0

    def __aiter__(self):
        return self

    async def __anext__(self):
        self.asked += 1
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)


def pull(guard: RequestGuard, chunks: Chunks) -> list:
    async def run():
        return [chunk async for chunk in guard.chunks(chunks)]

    return asyncio.run(run())


def test_a_request_at_its_deadline_asks_for_no_further_chunk():
    clock = FakeClock(0.0)
    guard = RequestGuard(RequestLimits(request_timeout=10), clock=clock)
    clock.now = 10.0
    chunks = Chunks({"audio": [0.0], "sample_rate": 1})
    with pytest.raises(LimitExceeded) as caught:
        pull(guard, chunks)
    assert caught.value.status == "DEADLINE_EXCEEDED" and chunks.asked == 0
    assert "ran longer than 10 s, the server's request timeout (--request-timeout)" in caught.value.message


def test_a_request_half_a_second_before_its_deadline_still_gets_its_chunks():
    clock = FakeClock(0.0)
    guard = RequestGuard(RequestLimits(request_timeout=10), clock=clock)
    clock.now = 9.5
    chunk = {"audio": [0.0], "sample_rate": 1}
    assert pull(guard, Chunks(chunk)) == [chunk]


def test_a_request_half_a_second_past_its_deadline_gets_no_chunk():
    clock = FakeClock(0.0)
    guard = RequestGuard(RequestLimits(request_timeout=10), clock=clock)
    clock.now = 10.5
    chunks = Chunks({"audio": [0.0], "sample_rate": 1})
    with pytest.raises(LimitExceeded):
        pull(guard, chunks)
    assert chunks.asked == 0


def test_audio_exactly_at_the_cap_is_within_it():
    guard = RequestGuard(RequestLimits(max_audio_seconds=2.0), clock=FakeClock(0.0))
    chunks = [{"audio": [0.0], "sample_rate": 1}, {"audio": [0.0], "sample_rate": 1}]
    assert pull(guard, Chunks(*chunks)) == chunks
    assert guard.audio_seconds == 2.0


def test_a_write_after_the_deadline_has_passed_is_not_waited_for():
    async def run():
        clock = FakeClock(0.0)
        guard = RequestGuard(RequestLimits(request_timeout=10), clock=clock)
        clock.now = 20.0
        loop = asyncio.get_running_loop()
        late = loop.create_future()
        loop.call_later(0.05, late.set_result, "sent")
        with pytest.raises(LimitExceeded) as caught:
            await guard.send(late)
        assert caught.value.stalled_write is not None
        await caught.value.stalled_write
        return caught.value

    error = asyncio.run(run())
    assert "--request-timeout" in error.message


def test_a_write_stalled_as_long_as_both_limits_is_the_deadline():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=0.05, request_timeout=0.05), clock=FakeClock(0.0))
        stuck = asyncio.get_running_loop().create_future()
        with pytest.raises(LimitExceeded) as caught:
            await guard.send(stuck)
        stuck.cancel()
        return caught.value

    error = asyncio.run(run())
    assert error.status == "DEADLINE_EXCEEDED" and "--request-timeout" in error.message
    assert error.stalled_write is not None


@pytest.mark.parametrize("field", ["text", "voice", "reference_transcript"])
def test_a_control_character_is_refused_in_each_spoken_field_naming_that_field(field):
    request = {"text": "hello", "voice": "v", "reference_transcript": "a transcript"}
    request[field] = "ab\x07c"
    with pytest.raises(InvalidSynthesisRequest) as caught:
        check_request_fields(request)
    assert caught.value.field == field
    assert str(caught.value) == f"{field} contains the control character '\\x07' at position 2; remove it"


def test_a_voice_or_transcript_given_as_null_is_no_voice_or_transcript():
    check_request_fields({"text": "hello", "voice": None, "reference_transcript": None})


def test_a_text_too_long_is_refused_naming_the_text_field():
    with pytest.raises(InvalidSynthesisRequest) as caught:
        check_request_fields({"text": "a" * 11}, max_text_chars=10)
    assert caught.value.field == "text"
    assert str(caught.value) == "text has 11 characters; the limit is 10, split it into several requests"


def test_audio_with_a_leading_channel_axis_counts_every_sample():
    import numpy as np

    assert audio_seconds({"audio": np.zeros((1, 24000), dtype=np.float32), "sample_rate": 24000}) == 1.0


@pytest.mark.parametrize("text", [123, ["hello"], {"text": "hello"}])
def test_a_text_that_is_not_a_string_is_refused_as_no_text(text):
    error = refused({"text": text})
    assert error.field == "text" and str(error) == "text is empty; give the sentence to synthesize"
