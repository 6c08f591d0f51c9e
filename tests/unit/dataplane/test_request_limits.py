"""Per-request limits: field lengths, the executor-declared text limit, audio cap, deadline and idle timeout."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from stagevisor.stages.piper import executors as demo
from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS, declared_max_text_chars
from stagevisor.stages.text import validate_text
from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor.dataplane.limits import (
    MAX_REFERENCE_TRANSCRIPT_CHARS,
    MAX_VOICE_CHARS,
    InvalidSynthesisRequest,
    LimitExceeded,
    RequestGuard,
    RequestLimits,
    audio_seconds,
    check_request_fields,
)
from stagevisor.supervisor.dataplane.synthesis import request_from_proto
from tests.fakes import FakeClock


def test_a_100_kb_voice_is_invalid_argument_and_not_echoed():
    with pytest.raises(InvalidSynthesisRequest) as caught:
        request_from_proto(spb.SynthesizeRequest(text="Hi.", voice="v" * 100_000))
    assert str(caught.value) == f"voice has 100000 characters; a voice name has at most {MAX_VOICE_CHARS}"


def test_an_oversized_reference_transcript_is_invalid_argument():
    with pytest.raises(InvalidSynthesisRequest, match=f"the limit is {MAX_REFERENCE_TRANSCRIPT_CHARS}"):
        request_from_proto(spb.SynthesizeRequest(text="Hi.", reference_transcript="t" * 100_000))


def test_a_voice_with_a_control_character_is_invalid_argument():
    with pytest.raises(InvalidSynthesisRequest, match="voice contains the control character"):
        check_request_fields({"text": "Hi.", "voice": "joe\x1b"})


def test_fields_at_their_limits_are_accepted():
    check_request_fields(
        {
            "text": "a" * DEFAULT_MAX_TEXT_CHARS,
            "voice": "v" * MAX_VOICE_CHARS,
            "reference_transcript": "t" * MAX_REFERENCE_TRANSCRIPT_CHARS,
        }
    )


def test_the_text_limit_is_the_one_passed_in():
    check_request_fields({"text": "a" * 64}, max_text_chars=64)
    with pytest.raises(InvalidSynthesisRequest, match="text has 65 characters; the limit is 64"):
        check_request_fields({"text": "a" * 65}, max_text_chars=64)


def test_the_demo_executor_declares_the_limit_the_service_advertises():
    """Before: the demo rejected 4,001-5,000 characters although the service allowed 5,000."""
    assert demo.Preprocessing.max_text_chars == DEFAULT_MAX_TEXT_CHARS
    text = "a" * DEFAULT_MAX_TEXT_CHARS
    assert validate_text({"text": text}, demo.Preprocessing.max_text_chars) == text
    check_request_fields({"text": text})


def test_the_smallest_declared_text_limit_wins_and_undeclared_stages_do_not_count():
    class Declares:
        def __init__(self, limit):
            self.max_text_chars = limit

    assert declared_max_text_chars([object(), Declares(300), Declares(120)]) == 120
    assert declared_max_text_chars([object(), Declares(True), Declares("9"), Declares(0)]) is None


def test_audio_seconds_counts_samples_at_the_chunk_rate():
    assert audio_seconds({"audio": np.zeros(24_000, np.float32), "sample_rate": 48_000}) == 0.5
    assert audio_seconds({"latent": 1}) == 0.0


async def chunks_of(seconds: list[float], rate: int = 1000, pause: asyncio.Event | None = None):
    for s in seconds:
        if pause is not None:
            await pause.wait()
        yield {"audio": np.zeros(int(s * rate), np.float32), "sample_rate": rate}


def test_audio_past_the_cap_ends_the_request_with_resource_exhausted():
    async def run():
        guard = RequestGuard(RequestLimits(max_audio_seconds=2.5))
        got = []
        with pytest.raises(LimitExceeded) as caught:
            async for chunk in guard.chunks(chunks_of([1, 1, 1, 1])):
                got.append(chunk)
        return got, caught.value

    got, error = asyncio.run(run())
    assert len(got) == 2
    assert (error.status, error.code) == ("RESOURCE_EXHAUSTED", "audio_limit_exceeded")
    assert "more than 2.5 s of audio" in error.message and "--max-audio-seconds" in error.message


def test_audio_up_to_the_cap_streams_in_full():
    async def run():
        guard = RequestGuard(RequestLimits(max_audio_seconds=3))
        return [c async for c in guard.chunks(chunks_of([1, 1, 1]))]

    assert len(asyncio.run(run())) == 3


def test_a_request_waiting_past_its_deadline_is_deadline_exceeded():
    async def run():
        guard = RequestGuard(RequestLimits(request_timeout=0.05))
        never = asyncio.Event()
        with pytest.raises(LimitExceeded) as caught:
            async for _ in guard.chunks(chunks_of([1], pause=never)):
                pass
        return caught.value

    error = asyncio.run(run())
    assert error.status == "DEADLINE_EXCEEDED" and "--request-timeout" in error.message
    assert error.stalled_write is None


def test_a_deadline_already_passed_stops_before_the_next_chunk():
    clock = FakeClock(0.0)

    async def run():
        guard = RequestGuard(RequestLimits(request_timeout=10), clock=clock)
        got = []
        with pytest.raises(LimitExceeded, match="ran longer than 10 s"):
            async for chunk in guard.chunks(chunks_of([1, 1, 1])):
                got.append(chunk)
                clock.now = 11
        return got

    assert len(asyncio.run(run())) == 1


def test_a_write_the_client_never_takes_is_an_idle_timeout_carrying_the_pending_write():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=0.05, request_timeout=60))
        stuck = asyncio.get_running_loop().create_future()
        with pytest.raises(LimitExceeded) as caught:
            await guard.send(stuck)
        error = caught.value
        assert error.stalled_write is not None and not error.stalled_write.done()
        stuck.set_result(None)  # the client reads again
        await error.stalled_write
        return error

    error = asyncio.run(run())
    assert error.status == "DEADLINE_EXCEEDED"
    assert "read no audio for 0.05 s (--stream-idle-timeout)" in error.message


def test_a_write_stalled_into_the_deadline_reports_the_deadline():
    async def run():
        guard = RequestGuard(RequestLimits(stream_idle_timeout=60, request_timeout=0.05))
        with pytest.raises(LimitExceeded, match="--request-timeout") as caught:
            await guard.send(asyncio.get_running_loop().create_future())
        caught.value.stalled_write.cancel()

    asyncio.run(run())


def test_writes_that_complete_pass_their_result_through():
    async def run():
        guard = RequestGuard(RequestLimits())

        async def write():
            return "sent"

        return await guard.send(write())

    assert asyncio.run(run()) == "sent"


@pytest.mark.parametrize("field", ["max_audio_seconds", "request_timeout", "stream_idle_timeout"])
def test_limits_must_be_positive(field):
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be > 0"):
        RequestLimits(**{field: 0})


def test_the_gateway_admits_texts_up_to_the_smallest_limit_its_workers_declared(tmp_path):
    from stagevisor.supervisor.dataplane.gateway import Gateway
    from stagevisor.supervisor.errors import RequestFailed
    from tests.integration.daemon_helpers import colocated_pipeline

    gateway = Gateway(colocated_pipeline(), {}, f"unix:{tmp_path}/sink.sock")
    assert gateway.max_text_chars == DEFAULT_MAX_TEXT_CHARS
    gateway.declare_text_limit("pipeline", 64)
    gateway.declare_text_limit("other", 300)
    assert gateway.max_text_chars == 64
    with pytest.raises(RequestFailed) as caught:
        gateway.open({"text": "a" * 65})
    assert caught.value.status == "INVALID_ARGUMENT" and "the limit is 64" in caught.value.message
    with pytest.raises(RequestFailed) as caught:  # within the limit: refused only because it is not started
        gateway.open({"text": "a" * 64})
    assert caught.value.status == "UNAVAILABLE"
    gateway.declare_text_limit("pipeline", None)  # a restarted worker that declares nothing
    assert gateway.max_text_chars == 300


def test_a_cancelled_request_cancels_its_pending_write():
    async def run():
        guard = RequestGuard(RequestLimits())
        stuck = asyncio.get_running_loop().create_future()
        sending = asyncio.create_task(guard.send(stuck))
        await asyncio.sleep(0)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        return stuck.cancelled()

    assert asyncio.run(run())


# -- codes that tell a client what to do (issue: lone surrogates, deadlines, oversized requests) --------


def test_a_lone_surrogate_is_invalid_naming_its_field_and_position():
    from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest, check_request_fields

    with pytest.raises(InvalidSynthesisRequest, match=r"lone surrogate \(U\+D800\) at position 1") as caught:
        check_request_fields({"text": "a\ud800b"})
    assert caught.value.field == "text"
    with pytest.raises(InvalidSynthesisRequest) as caught:
        check_request_fields({"text": "fine", "voice": "\udfff"})
    assert caught.value.field == "voice"


def test_every_field_check_names_its_field():
    from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest
    from stagevisor.supervisor.dataplane.synthesis import MAX_REFERENCE_AUDIO_BYTES, validate_request

    cases = {
        "text": dict(text=" "),
        "voice": dict(text="a", voice="v" * 10_000),
        "reference_transcript": dict(text="a", reference_transcript="t" * 10_000),
        "reference_audio": dict(text="a", reference_audio=bytes(MAX_REFERENCE_AUDIO_BYTES + 1)),
        "bad key!": dict(text="a", options={"bad key!": "1"}),
        "key\n": dict(text="a", options={"key\n": "1"}),  # `$` matched before a final newline
        "noise": dict(text="a", options={"noise": "\ud800"}),
    }
    for field, kwargs in cases.items():
        with pytest.raises(InvalidSynthesisRequest) as caught:
            validate_request(**kwargs)
        assert caught.value.field == field, (field, str(caught.value))


def test_instructions_take_as_many_characters_over_grpc_as_over_http_and_other_options_256():
    """A VoiceDesign checkpoint's voice is described in `instructions`: over gRPC (an option) it was refused past
    256 characters, where HTTP's field takes MAX_TEXT_CHARS."""
    from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest
    from stagevisor.supervisor.dataplane.synthesis import MAX_REQUEST_BYTES, MAX_TEXT_CHARS, validate_request

    described = validate_request(text="a", options={"instructions": "é" * MAX_TEXT_CHARS})
    assert len(described["options"]["instructions"]) == MAX_TEXT_CHARS
    with pytest.raises(InvalidSynthesisRequest, match=f"longer than {MAX_TEXT_CHARS} characters"):
        validate_request(text="a", options={"instructions": "x" * (MAX_TEXT_CHARS + 1)})
    with pytest.raises(InvalidSynthesisRequest, match="option 'style' is longer than 256 characters"):
        validate_request(text="a", options={"style": "x" * 257})
    assert MAX_REQUEST_BYTES > 4 * MAX_TEXT_CHARS * 2  # the text and the instructions, each all 4-byte characters


def test_the_public_message_limit_holds_a_minute_of_48_khz_reference_audio_and_every_other_field():
    from stagevisor.supervisor.dataplane.synthesis import (
        MAX_REFERENCE_AUDIO_BYTES,
        MAX_REQUEST_BYTES,
        PUBLIC_MAX_MESSAGE_BYTES,
        PUBLIC_SERVER_OPTIONS,
    )

    assert MAX_REFERENCE_AUDIO_BYTES >= 60 * 48_000 * 2 + 44  # a 60 s, 48 kHz, 16-bit mono WAV
    assert MAX_REQUEST_BYTES > MAX_REFERENCE_AUDIO_BYTES
    assert dict(PUBLIC_SERVER_OPTIONS)["grpc.max_receive_message_length"] == PUBLIC_MAX_MESSAGE_BYTES
    assert PUBLIC_MAX_MESSAGE_BYTES >= 2 * MAX_REQUEST_BYTES > 4 * 1024 * 1024


def test_a_deadline_is_a_504_and_not_a_500():
    from stagevisor.supervisor.http.errors import ApiError

    error = ApiError.from_status("DEADLINE_EXCEEDED", "too slow")
    assert error.status == 504 and error.body()["error"]["code"] == "deadline_exceeded"


def test_the_gateway_fails_a_request_the_pipeline_has_sent_nothing_for_its_idle_timeout_and_cancels_it_everywhere():
    """No request outlives a worker that cannot answer: it fails UNAVAILABLE, not at the client's deadline, and is
    cancelled in every worker on its route."""
    import asyncio

    from stagevisor.supervisor.dataplane.request_handle import RequestHandle
    from stagevisor.supervisor.errors import RequestFailed

    class Gateway:
        def __init__(self) -> None:
            self.cancelled: list[str] = []

        def close_request(self, handle: RequestHandle) -> None:
            pass

        def cancel_everywhere(self, request_id: str, reason: str) -> None:
            self.cancelled.append(request_id)

        def retry_after_unavailable(self) -> int:
            return 2

    async def scenario():
        gateway = Gateway()
        handle = RequestHandle(gateway, "r1", expected_done=1, idle_timeout=0.2)
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, handle.push, "first", lambda: None)  # within the limit: a chunk arrives
        got = []
        with pytest.raises(RequestFailed) as caught:
            async for chunk in handle:
                got.append(chunk)
        assert got == ["first"]
        assert (
            caught.value.status == "UNAVAILABLE" and "sent nothing for this request for 0.2 s" in caught.value.message
        )
        # Stopped in every worker: one that is alive (a request waiting for its turn) made all of it for nobody.
        assert gateway.cancelled == ["r1"]

    asyncio.run(scenario())


def test_a_workers_keep_alive_starts_the_pipeline_idle_timeout_again():
    """A worker that holds the request says so (a stage runs it, or it waits for a turn): only a request no worker
    holds meets the idle timeout."""
    import asyncio

    from stagevisor.supervisor.dataplane.request_handle import RequestHandle

    class Gateway:
        def close_request(self, handle: RequestHandle) -> None:
            pass

        def cancel_everywhere(self, request_id: str, reason: str) -> None:
            pass

        def retry_after_unavailable(self) -> int:
            return 2

    async def scenario():
        handle = RequestHandle(Gateway(), "r1", expected_done=1, idle_timeout=0.2)
        loop = asyncio.get_running_loop()
        for at in (0.1, 0.2, 0.3, 0.4):
            loop.call_later(at, handle.keep_alive)
        loop.call_later(0.5, handle.push, "late", lambda: None)  # past 0.2 s of silence, within 0.2 s of a keep-alive
        loop.call_later(0.55, handle.finish_branch, ())
        return [chunk async for chunk in handle]

    assert asyncio.run(scenario()) == ["late"]


def test_a_worker_tells_the_gateway_every_few_seconds_which_requests_it_still_holds():
    import asyncio

    from stagevisor.supervisor.dataplane.request_state import RequestTable
    from stagevisor.supervisor.dataplane.streams import ChunkQueue
    from tests.fakes import poll_until

    told: list[list[str]] = []

    async def scenario():
        table = RequestTable(
            "w",
            {"s"},
            lambda state: None,
            lambda *args: None,
            lambda *args: None,
            stream_idle_timeout=0.2,  # the janitor's turn: every 0.05 s
            keep_alive=told.append,
        )
        table.admit("held")
        table.admit("failed").failed = True  # failed here: the gateway has its answer
        # Waiting on another worker's stream: that worker says so while it holds the request; one that died cannot,
        # and the gateway's idle timeout must then fail it (kept alive from here, it waited for the 300 s stream
        # timeout instead).
        table.admit("waits").inbound[("a", "s")] = ChunkQueue(4)
        assert await poll_until(lambda: len(told) >= 2)  # two of the janitor's turns
        table.close()

    asyncio.run(scenario())
    assert told and all(ids == ["held"] for ids in told)


def test_the_pipeline_idle_timeout_must_be_positive():
    from stagevisor.supervisor.dataplane.limits import RequestLimits

    with pytest.raises(ValueError, match="pipeline-idle-timeout must be > 0"):
        RequestLimits(pipeline_idle_timeout=0)
