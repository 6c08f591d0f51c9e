"""Running one speech request: admission and early failures as API errors, the audio stream, SSE, closing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from stagevisor.supervisor.dataplane.admission import AdmissionRejected
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.dataplane.synthesis import to_pcm16
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.http.audio import wav_header
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http import speech as speech_module
from stagevisor.supervisor.http.request import SpeechRequest
from stagevisor.supervisor.http.speech import (
    ClientGone,
    next_chunk,
    open_speech,
    sse_event,
    status_of,
    synthesize,
    unless_disconnected,
)
from tests.fakes import LeavingClient, ScriptedGateway, ScriptedHandle, audio_chunk

RATE = 24000


class Meter:
    """A RequestMeter stand-in recording what the request path tells it."""

    def __init__(self, exports_spans: bool = False) -> None:
        self.exports_spans = exports_spans
        self.attached = None
        self.audio_calls: list[tuple[int, int]] = []
        self.finished: list[str] = []

    def attach(self, handle) -> None:
        self.attached = handle

    def audio(self, samples: int, rate: int) -> None:
        self.audio_calls.append((samples, rate))

    def finish(self, code: str) -> None:
        self.finished.append(code)


def speech(**fields) -> SpeechRequest:
    return SpeechRequest(**{"model": "m", "input": "hello there", "response_format": "pcm", **fields})


async def read_all(stream) -> bytes:
    return b"".join([piece async for piece in stream.pieces()])


def api_error(gateway, request: SpeechRequest, meter=None, client=None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        asyncio.run(open_speech(gateway, request, RATE, meter, client))
    return caught.value


# ---- the audio stream -------------------------------------------------------------


def test_a_stream_sends_each_chunk_as_pcm_and_counts_its_samples():
    chunks = [audio_chunk(100), audio_chunk(50, value=-0.5)]
    meter = Meter()
    handle = ScriptedHandle(chunks)

    async def scenario():
        stream = await open_speech(ScriptedGateway(handle), speech(), RATE, meter)
        try:
            return stream, await read_all(stream)
        finally:
            stream.close()

    stream, audio = asyncio.run(scenario())
    assert audio == to_pcm16(chunks[0]["audio"]) + to_pcm16(chunks[1]["audio"])
    assert stream.samples == 150 and stream.sample_rate == RATE and stream.request_id == "req-1"
    assert meter.attached is handle
    assert meter.audio_calls == [(100, RATE), (50, RATE)]
    assert meter.finished == ["OK"]


def test_closing_a_stream_closes_its_request_once_however_often_it_is_closed():
    handle, meter = ScriptedHandle([audio_chunk(10)]), Meter()

    async def scenario():
        stream = await open_speech(ScriptedGateway(handle), speech(), RATE, meter)
        await read_all(stream)
        stream.close()
        stream.close()

    asyncio.run(scenario())
    assert handle.closed == 1
    assert meter.finished == ["OK"]


def test_a_stream_closed_before_its_end_is_counted_cancelled_and_its_request_closed():
    handle, meter = ScriptedHandle([audio_chunk(10), audio_chunk(10)]), Meter()

    async def scenario():
        stream = await open_speech(ScriptedGateway(handle), speech(), RATE, meter)
        stream.close()

    asyncio.run(scenario())
    assert handle.closed == 1
    assert meter.finished == ["CANCELLED"]


def test_a_request_that_produced_no_audio_is_an_empty_stream_at_the_hinted_rate():
    async def scenario():
        stream = await open_speech(ScriptedGateway(ScriptedHandle([])), speech(response_format="wav"), 16000, Meter())
        try:
            return stream.sample_rate, await read_all(stream)
        finally:
            stream.close()

    rate, audio = asyncio.run(scenario())
    assert (rate, audio) == (16000, wav_header(16000))


def test_audio_asked_for_at_another_rate_is_resampled_to_it():
    async def scenario():
        stream = await open_speech(
            ScriptedGateway(ScriptedHandle([audio_chunk(2400)])), speech(sample_rate=16000), RATE, Meter()
        )
        try:
            return stream, await read_all(stream)
        finally:
            stream.close()

    stream, audio = asyncio.run(scenario())
    assert stream.sample_rate == 16000 and stream.model_rate == RATE
    assert len(audio) // 2 == stream.samples
    assert stream.samples == pytest.approx(1600, abs=2)


def test_a_failure_mid_stream_is_counted_with_its_status():
    meter = Meter()
    failure = RequestFailed("DEADLINE_EXCEEDED", "too slow")

    async def scenario():
        stream = await open_speech(ScriptedGateway(ScriptedHandle([audio_chunk(10)], failure)), speech(), RATE, meter)
        try:
            with pytest.raises(RequestFailed):
                await read_all(stream)
        finally:
            stream.close()

    asyncio.run(scenario())
    assert meter.finished == ["DEADLINE_EXCEEDED"]


def test_an_unexpected_error_mid_stream_is_counted_unknown():
    meter = Meter()

    async def scenario():
        stream = await open_speech(
            ScriptedGateway(ScriptedHandle([audio_chunk(10)], KeyError("x"))), speech(), RATE, meter
        )
        try:
            with pytest.raises(KeyError):
                await read_all(stream)
        finally:
            stream.close()

    asyncio.run(scenario())
    assert meter.finished == ["UNKNOWN"]


# ---- requests that cannot start ---------------------------------------------------


def test_a_busy_rejection_is_a_429_with_its_retry_hint_and_reason_counted_with_its_status():
    meter = Meter()
    refusal = AdmissionRejected("RESOURCE_EXHAUSTED", "BUSY", "the daemon is busy", retry_after=7)
    error = api_error(ScriptedGateway(refusal=refusal), speech(), meter)
    assert (error.status, error.code, error.message) == (429, "busy", "the daemon is busy")
    assert error.headers == {"Retry-After": "7"}
    assert meter.finished == ["RESOURCE_EXHAUSTED"]


def test_a_draining_rejection_is_a_503():
    meter = Meter()
    refusal = AdmissionRejected("UNAVAILABLE", "DRAINING", "shutting down", retry_after=1)
    error = api_error(ScriptedGateway(refusal=refusal), speech(), meter)
    assert (error.status, error.code) == (503, "draining")
    assert meter.finished == ["UNAVAILABLE"]


def test_a_failed_group_refusal_is_a_503_that_tells_clients_not_to_retry():
    """No Retry-After (no wait ends it), and `X-Should-Retry: false`: OpenAI's SDKs retry a 503 on their own."""
    refusal = AdmissionRejected("UNAVAILABLE", "GROUP_FAILED", "process group 'vocoder' FAILED", retry_after=None)
    error = api_error(ScriptedGateway(refusal=refusal), speech(), Meter())
    assert (error.status, error.code) == (503, "group_failed")
    assert error.headers == {"X-Should-Retry": "false"}


def test_a_pipeline_refusal_at_submission_is_its_status_with_the_request_id():
    meter = Meter()
    refusal = RequestFailed("UNAVAILABLE", "no worker", request_id="r-9")
    error = api_error(ScriptedGateway(refusal=refusal), speech(), meter)
    assert error.status == 503 and error.message == "no worker (request r-9)"
    assert error.headers == {"X-Request-Id": "r-9"}  # as an audio answer, and an unexpected 500, carry it
    assert meter.finished == ["UNAVAILABLE"]


def test_a_failure_before_the_first_chunk_is_an_api_error_naming_the_option_and_its_request_is_closed():
    meter = Meter()
    failure = RequestFailed("INVALID_ARGUMENT", "option 'temperature' must be at most 2")
    handle = ScriptedHandle([], failure)
    error = api_error(ScriptedGateway(handle), speech(options={"temperature": "3", "top_k": "5"}), meter)
    assert (error.status, error.param) == (400, "temperature")
    assert handle.closed == 1
    assert meter.finished == ["INVALID_ARGUMENT"]


def test_a_request_past_its_deadline_before_its_first_audio_tells_openai_sdks_not_to_retry_it():
    """Before: a 504 without `X-Should-Retry: false`, which the openai SDKs retry twice by default, each retry
    running up to --request-timeout again."""
    failure = RequestFailed("DEADLINE_EXCEEDED", "no audio within 30 s", request_id="r-3")
    error = api_error(ScriptedGateway(ScriptedHandle([], failure)), speech(), Meter())
    assert error.status == 504
    assert error.response().headers["x-should-retry"] == "false"
    assert error.headers["X-Request-Id"] == "r-3"
    unavailable = api_error(ScriptedGateway(refusal=RequestFailed("UNAVAILABLE", "no worker")), speech(), Meter())
    assert "X-Should-Retry" not in unavailable.headers  # a worker coming back: retrying is right


def test_a_failure_naming_no_option_has_no_param():
    failure = RequestFailed("INTERNAL", "the stage crashed")
    error = api_error(ScriptedGateway(ScriptedHandle([], failure)), speech(options={"top_k": "5"}), Meter())
    assert (error.status, error.param) == (500, None)


def test_an_invalid_request_is_refused_before_submission_and_counted_invalid():
    meter, gateway = Meter(), ScriptedGateway(ScriptedHandle([audio_chunk(1)]))
    error = api_error(gateway, speech(input="   "), meter)
    assert (error.status, error.param) == (400, "input")
    assert gateway.payloads == []
    assert meter.finished == ["INVALID_ARGUMENT"]


@pytest.mark.parametrize("exports, timings", [(True, True), (False, None)])
def test_the_payload_asks_for_timings_only_when_spans_are_exported(exports, timings):
    gateway = ScriptedGateway(ScriptedHandle([]))

    async def scenario():
        (await open_speech(gateway, speech(), RATE, Meter(exports_spans=exports))).close()

    asyncio.run(scenario())
    assert gateway.payloads[0].get("timings") is timings


class Disconnecting:
    """A starlette request whose client goes away at once."""

    async def receive(self) -> dict:
        return {"type": "http.disconnect"}


class Connected:
    """A starlette request whose client stays until the test ends it."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_a_client_gone_while_waiting_for_the_first_chunk_cancels_the_request():
    meter = Meter()

    handle = ScriptedHandle(then_wait=True)  # its first chunk never comes

    async def scenario():
        with pytest.raises(ClientGone):
            await open_speech(ScriptedGateway(handle), speech(), RATE, meter, Disconnecting())

    asyncio.run(scenario())
    assert handle.closed == 1
    assert meter.finished == ["CANCELLED"]


def test_work_is_cancelled_when_its_client_disconnects_and_awaited_plainly_without_a_request():
    cancelled = []

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def answer():
        return 42

    async def scenario():
        with pytest.raises(ClientGone):
            await unless_disconnected(Disconnecting(), forever())
        client = Connected()
        result = await unless_disconnected(client, answer())
        return result, await unless_disconnected(None, answer())

    assert asyncio.run(scenario()) == (42, 42)
    assert cancelled == [True]


def test_the_next_chunk_is_none_at_the_end():
    """What a chunk holds is the gateway's to check (tests/unit/dataplane/test_gateway_audio.py)."""

    async def iterate(*items):
        for item in items:
            yield item

    async def scenario():
        good = audio_chunk(1)
        assert await next_chunk(iterate(good)) is good
        assert await next_chunk(iterate()) is None

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "http, status", [(400, "INVALID_ARGUMENT"), (404, "NOT_FOUND"), (429, "RESOURCE_EXHAUSTED"), (503, "UNAVAILABLE")]
)
def test_an_api_error_is_counted_under_the_grpc_status_it_stands_for(http, status):
    assert status_of(ApiError(http, "x", code="c")) == status


@pytest.mark.parametrize("http, status", [(413, "INVALID_ARGUMENT"), (499, "CANCELLED"), (502, "INTERNAL")])
def test_an_api_error_without_its_own_grpc_status_counts_as_invalid_or_internal(http, status):
    assert status_of(ApiError(http, "x", code="c")) == status


# ---- POST /v1/audio/speech's response ---------------------------------------------


def client_for(gateway: ScriptedGateway, request: SpeechRequest, meter: Meter | None = None) -> TestClient:
    async def route(http_request):
        return await synthesize(http_request, gateway, request, RATE, meter)

    return TestClient(Starlette(routes=[Route("/speech", route, methods=["POST"])]))


def events(body: bytes) -> list[dict]:
    parts = body.split(b"\n\n")
    assert parts[-1] == b""
    assert all(p.startswith(b"data: ") for p in parts[:-1])
    return [json.loads(p[len(b"data: ") :]) for p in parts[:-1]]


def test_the_audio_response_streams_the_encoded_audio_with_its_headers():
    chunks = [audio_chunk(100), audio_chunk(20)]
    handle, meter = ScriptedHandle(chunks, request_id="req-7"), Meter()
    with client_for(ScriptedGateway(handle), speech(), meter) as client:
        response = client.post("/speech")
    assert response.status_code == 200
    assert response.content == to_pcm16(chunks[0]["audio"]) + to_pcm16(chunks[1]["audio"])
    assert response.headers["content-type"] == "audio/pcm"
    assert response.headers["x-request-id"] == "req-7"
    assert response.headers["x-sample-rate"] == str(RATE)
    assert response.headers["cache-control"] == "no-store"
    assert handle.closed == 1 and meter.finished == ["OK"]


def test_sse_sends_each_piece_then_the_usage_in_seconds_of_the_audio_sent():
    handle = ScriptedHandle([audio_chunk(2400), audio_chunk(2400)])
    request = speech(stream_format="sse", sample_rate=16000, input="hi there")
    with client_for(ScriptedGateway(handle), request) as client:
        response = client.post("/speech")
    assert response.headers["content-type"].startswith("text/event-stream")
    sent = events(response.content)
    *deltas, done = sent
    assert {e["type"] for e in deltas} == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert done["type"] == "speech.audio.done"
    # OpenAI's counts, required by its typed clients (a token: a character of input), then stagevisor's own
    assert {k: done["usage"][k] for k in ("input_tokens", "output_tokens", "total_tokens")} == {
        "input_tokens": 8,
        "output_tokens": 0,
        "total_tokens": 8,
    }
    assert done["usage"]["input_characters"] == len("hi there")
    assert done["usage"]["output_audio_seconds"] == len(audio) / 2 / 16000
    assert done["usage"]["output_audio_seconds"] == pytest.approx(0.2, abs=0.001)
    assert handle.closed == 1


def test_sse_usage_gives_the_audio_s_duration_to_the_millisecond():
    """At 11025 Hz the done event's usage read `"output_audio_seconds":1.5500226757369615`."""
    handle = ScriptedHandle([audio_chunk(17089, rate=11025)])
    with client_for(ScriptedGateway(handle), speech(stream_format="sse", sample_rate=11025)) as client:
        body = client.post("/speech").content
    *deltas, done = events(body)
    assert len(b"".join(base64.b64decode(e["audio"]) for e in deltas)) == 2 * 17089  # 1.5500226... s of audio
    assert done["usage"]["output_audio_seconds"] == 1.55 and b'"output_audio_seconds":1.55}' in body


def test_sse_ends_a_stream_failing_midway_with_an_error_event():
    handle = ScriptedHandle([audio_chunk(10)], RequestFailed("INTERNAL", "the vocoder crashed", request_id="r-3"))
    with client_for(ScriptedGateway(handle), speech(stream_format="sse")) as client:
        response = client.post("/speech")
    last = events(response.content)[-1]
    assert last["type"] == "error"
    assert last["error"]["message"] == "the vocoder crashed (request r-3)"
    assert last["error"]["type"] == "server_error"
    assert handle.closed == 1


def test_an_audio_response_failing_midway_is_cut_off_and_its_request_closed():
    handle = ScriptedHandle([audio_chunk(10)], RequestFailed("INTERNAL", "the vocoder crashed"))
    with client_for(ScriptedGateway(handle), speech()) as client:
        with pytest.raises(Exception, match="the vocoder crashed"):
            client.post("/speech")
    assert handle.closed == 1


def test_an_sse_event_is_one_compact_json_data_line():
    assert sse_event({"type": "x", "n": 1}) == b'data: {"type":"x","n":1}\n\n'


def test_speech_requests_read_their_gateway_s_limits():
    gateway = ScriptedGateway(ScriptedHandle([audio_chunk(RATE), audio_chunk(RATE)]))
    gateway.limits = RequestLimits(max_audio_seconds=1.5)

    async def scenario():
        stream = await open_speech(gateway, speech(), RATE, Meter())
        try:
            with pytest.raises(RequestFailed) as caught:
                await read_all(stream)
            return caught.value.status
        finally:
            stream.close()

    assert asyncio.run(scenario()) == "RESOURCE_EXHAUSTED"


def test_an_unexpected_error_at_submission_is_counted_unknown_and_raised():
    meter = Meter()
    with pytest.raises(RuntimeError, match="gateway broke"):
        asyncio.run(open_speech(ScriptedGateway(refusal=RuntimeError("gateway broke")), speech(), RATE, meter))
    assert meter.finished == ["UNKNOWN"]


def test_a_wait_cancelled_from_outside_cancels_the_work_and_the_watch_on_its_client():
    cancelled = []

    async def forever(name):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    class Watched:
        async def receive(self) -> dict:
            await forever("watch")
            return {"type": "http.disconnect"}

    async def scenario():
        waiting = asyncio.ensure_future(unless_disconnected(Watched(), forever("work")))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await asyncio.sleep(0)
        return waiting.cancelled(), sorted(cancelled)  # before asyncio.run cancels what is left

    assert asyncio.run(scenario()) == (True, ["watch", "work"])


class ThreadNoting:
    """An encoder that notes which thread encodes and finishes; `threaded` as given."""

    def __init__(self, threaded: bool) -> None:
        self.threaded = threaded
        self.sample_rate = self.output_rate = RATE
        self.threads: list[int] = []

    def encode(self, pcm: bytes) -> bytes:
        self.threads.append(threading.get_ident())
        return pcm

    def finish(self) -> bytes:
        self.threads.append(threading.get_ident())
        return b""

    def close(self) -> None:
        pass


@pytest.mark.parametrize("threaded", [True, False])
def test_a_costly_encoder_runs_off_the_event_loop_and_a_cheap_one_on_it(monkeypatch, threaded):
    encoder = ThreadNoting(threaded)
    monkeypatch.setattr(speech_module, "make_encoder", lambda fmt, rate: encoder)

    async def scenario():
        stream = await open_speech(ScriptedGateway(ScriptedHandle([audio_chunk(10)])), speech(), RATE, Meter())
        try:
            await read_all(stream)
        finally:
            stream.close()
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(encoder.threads) == 2
    assert all((thread != loop_thread) is threaded for thread in encoder.threads)


def test_a_resampled_sse_stream_names_the_rate_sent_counts_characters_and_sends_no_empty_delta():
    # soxr holds back the first sample: that chunk encodes to nothing, and no event carries nothing.
    handle = ScriptedHandle([audio_chunk(1), audio_chunk(2400)])
    text = "héllo wörld ✓"
    request = speech(stream_format="sse", sample_rate=16000, input=text)
    with client_for(ScriptedGateway(handle), request) as client:
        response = client.post("/speech")
    assert response.headers["x-sample-rate"] == "16000"
    *deltas, done = events(response.content)
    assert deltas and all(base64.b64decode(e["audio"]) for e in deltas)
    assert done["usage"]["input_characters"] == len(text) == 13


class ClosingNoted(ThreadNoting):
    """An encoder that counts its closes."""

    def __init__(self) -> None:
        super().__init__(threaded=False)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("read", [True, False])
def test_closing_a_stream_closes_its_encoder_once_whether_or_not_it_ran_to_its_end(monkeypatch, read):
    encoder = ClosingNoted()
    monkeypatch.setattr(speech_module, "make_encoder", lambda fmt, rate: encoder)

    async def scenario():
        stream = await open_speech(
            ScriptedGateway(ScriptedHandle([audio_chunk(10), audio_chunk(10)])), speech(), RATE, Meter()
        )
        if read:
            await read_all(stream)
        stream.close()
        stream.close()

    asyncio.run(scenario())
    assert encoder.closed == 1


def test_work_cancelled_for_a_client_gone_has_finished_its_cleanup_when_client_gone_is_raised():
    cleaned = []

    async def forever():
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("work")

    async def scenario():
        with pytest.raises(ClientGone):
            await unless_disconnected(Disconnecting(), forever())
        return list(cleaned)  # no loop turn in between: the cleanup ran inside unless_disconnected

    assert asyncio.run(scenario()) == ["work"]


def test_the_watch_on_a_client_stops_once_the_work_is_done():
    stopped = []

    class Staying:
        async def receive(self) -> dict:
            try:
                await asyncio.Event().wait()
            finally:
                stopped.append("watch")
            return {"type": "http.disconnect"}

    async def answer():
        return 7

    async def scenario():
        result = await unless_disconnected(Staying(), answer())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return result, list(stopped), len(asyncio.all_tasks())  # before asyncio.run cancels what is left

    assert asyncio.run(scenario()) == (7, ["watch"], 1)


def test_a_request_with_no_audio_from_voices_declaring_no_rate_is_an_empty_24_khz_stream():
    from types import SimpleNamespace

    from stagevisor.supervisor.http.app import create_app
    from tests.fakes import empty_topology, one_group_status

    class Daemon:
        plan = SimpleNamespace(model="fake", model_path="test/fake", stages=(SimpleNamespace(stand_in=False),))
        gateway = ScriptedGateway(ScriptedHandle([]))
        voice_names: dict = {}

        def status(self):
            return one_group_status("READY")

        def topology(self):
            return empty_topology()

        def voices(self) -> list:
            return [{"id": "heart", "language": "en"}]

    client = TestClient(create_app(Daemon()))
    response = client.post("/v1/audio/speech", json={"model": "fake", "input": "hi", "response_format": "wav"})
    assert response.status_code == 200, response.text
    assert response.headers["x-sample-rate"] == "24000"
    assert response.content == wav_header(24000)


def test_a_failure_before_the_first_chunk_names_the_quoted_option_and_the_request_id():
    failure = RequestFailed(
        "INVALID_ARGUMENT", "option 'top_k' must be below 50 when temperature is set", request_id="r-4"
    )
    gateway = ScriptedGateway(ScriptedHandle([], failure))
    error = api_error(gateway, speech(options={"temperature": "1", "top_k": "99"}), Meter())
    assert error.param == "top_k"  # quoted in the message; `temperature` is only mentioned
    assert error.message == "option 'top_k' must be below 50 when temperature is set (request r-4)"
    assert error.headers == {"X-Request-Id": "r-4"}


def test_a_stream_takes_its_rate_from_its_first_chunk_not_from_the_hint():
    chunks = [audio_chunk(100, rate=16000), audio_chunk(50, rate=16000)]

    async def scenario():
        stream = await open_speech(ScriptedGateway(ScriptedHandle(chunks)), speech(), RATE, Meter())
        try:
            return stream.sample_rate, await read_all(stream)
        finally:
            stream.close()

    rate, audio = asyncio.run(scenario())
    assert rate == 16000
    assert audio == to_pcm16(chunks[0]["audio"]) + to_pcm16(chunks[1]["audio"])


def test_a_request_cancelled_while_waiting_for_its_first_chunk_is_closed_and_counted_cancelled():
    meter = Meter()

    handle = ScriptedHandle(then_wait=True)  # its first chunk never comes

    async def scenario():
        opening = asyncio.ensure_future(open_speech(ScriptedGateway(handle), speech(), RATE, meter))
        for _ in range(5):
            await asyncio.sleep(0)
        opening.cancel()
        await asyncio.gather(opening, return_exceptions=True)
        return opening.cancelled()

    assert asyncio.run(scenario()) is True
    assert handle.closed == 1 and meter.finished == ["CANCELLED"]


def test_the_rate_header_is_the_rate_the_codec_sends_not_the_rate_it_was_given():
    handle = ScriptedHandle([audio_chunk(4410, rate=44100)])
    with client_for(ScriptedGateway(handle), speech(response_format="opus")) as client:
        response = client.post("/speech")
    assert response.status_code == 200 and response.content.startswith(b"OggS")
    assert response.headers["x-sample-rate"] == "48000"  # Opus takes no 44.1 kHz


def test_the_text_limit_is_the_one_the_gateway_s_pipeline_declares():
    gateway = ScriptedGateway(ScriptedHandle([audio_chunk(1)]))
    gateway.max_text_chars = 5
    error = api_error(gateway, speech(input="six ch"), Meter())
    assert (error.status, error.param) == (400, "input")
    assert gateway.payloads == []


def test_an_audio_response_asks_proxies_not_to_buffer_it():
    with client_for(ScriptedGateway(ScriptedHandle([audio_chunk(10)])), speech()) as client:
        response = client.post("/speech")
    assert response.headers["x-accel-buffering"] == "no"


def test_sse_reports_a_failure_midway_under_its_own_status():
    handle = ScriptedHandle([audio_chunk(10)], RequestFailed("RESOURCE_EXHAUSTED", "too much audio"))
    with client_for(ScriptedGateway(handle), speech(stream_format="sse")) as client:
        response = client.post("/speech")
    error = events(response.content)[-1]["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "resource_exhausted")


def test_a_stages_own_code_is_the_error_code_before_the_first_audio_and_the_status_stays():
    """Before: `invalid_argument` whatever the stage said; its code was only inside the message."""
    failure = RequestFailed("INVALID_ARGUMENT", "unknown voice 'alloy'", request_id="r-4", code="QWEN3_UNKNOWN_SPEAKER")
    error = api_error(ScriptedGateway(ScriptedHandle([], failure)), speech(), Meter())
    assert error.body()["error"] == {
        "message": "unknown voice 'alloy' (request r-4)",
        "type": "invalid_request_error",
        "param": None,
        "code": "QWEN3_UNKNOWN_SPEAKER",
    }
    assert error.status == 400


def test_a_stages_own_code_reaches_the_sse_error_event():
    handle = ScriptedHandle([audio_chunk(10)], RequestFailed("INTERNAL", "the cache is full", code="ENGINE_CACHE_FULL"))
    with client_for(ScriptedGateway(handle), speech(stream_format="sse")) as client:
        response = client.post("/speech")
    error = events(response.content)[-1]["error"]
    assert (error["type"], error["code"]) == ("server_error", "ENGINE_CACHE_FULL")


def test_without_a_stages_code_the_error_code_is_the_status_as_before():
    error = api_error(ScriptedGateway(ScriptedHandle([], RequestFailed("INVALID_ARGUMENT", "no"))), speech(), Meter())
    assert error.code == "invalid_argument"


def test_the_audio_cap_midway_is_the_requests_fault_not_a_rate_limit():
    """Before: `rate_limit_error` (429), which tells a client to retry what makes the same audio again."""
    from stagevisor.supervisor.dataplane.limits import AUDIO_LIMIT_EXCEEDED, LimitExceeded

    capped = LimitExceeded(
        "RESOURCE_EXHAUSTED", "more than 1 s of audio (--max-audio-seconds)", code=AUDIO_LIMIT_EXCEEDED
    )
    handle = ScriptedHandle([audio_chunk(10)], capped)
    with client_for(ScriptedGateway(handle), speech(stream_format="sse")) as client:
        response = client.post("/speech")
    error = events(response.content)[-1]["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "audio_limit_exceeded")
    assert "--max-audio-seconds" in error["message"]


@pytest.mark.parametrize("fmt, media", [("wav", "audio/wav"), ("opus", "audio/ogg"), ("mp3", "audio/mpeg")])
def test_an_audio_response_is_typed_by_the_format_asked_for(fmt, media):
    with client_for(ScriptedGateway(ScriptedHandle([audio_chunk(2400)])), speech(response_format=fmt)) as client:
        response = client.post("/speech")
    assert response.headers["content-type"] == media


def test_a_stream_left_while_its_last_piece_is_being_sent_counts_as_cancelled():
    meter = Meter()

    async def scenario():
        stream = await open_speech(ScriptedGateway(ScriptedHandle([])), speech(response_format="wav"), RATE, meter)
        pieces = stream.pieces()
        last = await pieces.__anext__()  # an empty WAV stream: its header is its last piece
        await pieces.aclose()  # the client went away before taking the next one
        stream.close()
        return last

    assert asyncio.run(scenario()) == wav_header(RATE)
    assert meter.finished == ["CANCELLED"]


# ---- the WebSocket stream's sentences ------------------------------------------------------


def test_a_stream_sentence_whose_fields_are_refused_is_counted_as_the_same_post_would_be():
    """A WebSocket session whose `start` carries a voice or speed the model refuses ends at its first
    sentence with the 400 a POST gets; that sentence is counted under INVALID_ARGUMENT, as the POST is."""
    from stagevisor.supervisor.http.stream import SessionEnd, _Session

    class MeteredGateway(ScriptedGateway):
        def __init__(self) -> None:
            super().__init__()
            self.meters: list[Meter] = []
            self.metrics = self

        def start_request(self) -> Meter:
            self.meters.append(Meter())
            return self.meters[-1]

    async def refuse(fields: dict) -> tuple[SpeechRequest, None]:
        raise ApiError(400, "voice 'nope' is not available", param="voice", code="voice_not_found")

    gateway = MeteredGateway()
    session = _Session(None, refuse, gateway, lambda served: RATE, "m")  # type: ignore[arg-type]
    with pytest.raises(SessionEnd):
        asyncio.run(session._sentence("Hello there."))
    assert [meter.finished for meter in gateway.meters] == [["INVALID_ARGUMENT"]]
    assert gateway.payloads == []  # refused before admission


@pytest.mark.parametrize("then", ["reads again", "goes away"])
def test_a_client_that_reads_nothing_loses_its_request_after_the_stream_idle_timeout_as_on_grpc(then):
    """A client that stops reading the body blocks the server's write; past --stream-idle-timeout the request is
    ended in the workers (its admission slot freed) and counted DEADLINE_EXCEEDED at once, and the body is cut
    (StreamAborted, which the app logs as a cut on purpose) once the pending write leaves, whether the client
    reads again or its write fails, as the gRPC servicer does."""
    from dataclasses import replace

    from stagevisor.supervisor.http.speech import StreamAborted

    handle, meter = ScriptedHandle([audio_chunk(2400)] * 3), Meter()
    gateway = ScriptedGateway(handle)
    gateway.limits = replace(RequestLimits(), stream_idle_timeout=0.05)

    async def scenario() -> None:
        stalled: list[asyncio.Future] = []

        async def send(message) -> None:
            if message["type"] == "http.response.body":  # the client reads nothing: the write never leaves
                stalled.append(asyncio.get_running_loop().create_future())
                await stalled[-1]

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        response = await synthesize(None, gateway, speech(), RATE, meter)  # type: ignore[arg-type]
        call = asyncio.ensure_future(response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0  # the timeout is 0.05 s; the bound only stops a broken run
        while not meter.finished and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert meter.finished == ["DEADLINE_EXCEEDED"] and handle.closed == 1
        assert not call.done() and len(stalled) == 1  # still waiting for the client to read or go away
        if then == "reads again":  # the body is cut there
            stalled[0].set_result(None)
        else:
            stalled[0].set_exception(OSError("the client is gone"))
        with pytest.raises(StreamAborted):
            await call
        assert meter.finished == ["DEADLINE_EXCEEDED"]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "spec_version, gone",
    [
        ("2.3", "stalled"),  # uvicorn: the client stops reading, then leaves; Starlette cancels the stalled write
        ("2.4", "start"),  # the response start fails: the body never runs
        ("2.4", "body"),  # a write of the body fails: the body is left suspended between two pieces
    ],
)
def test_a_client_gone_before_or_while_its_response_is_written_has_its_request_closed_at_once(spec_version, gone):
    """The request of a response whose client went away is closed (cancelled in the workers, its admission slot
    freed, counted CANCELLED) when the response's ASGI call ends, whether its body never ran or was left
    suspended in a write: the body's own `finally` would run only once the garbage collector finalizes it, or
    never, and until then the request holds its slot and its workers' state."""
    handle, meter = ScriptedHandle([audio_chunk(100)] * 3), Meter()

    async def scenario() -> None:
        client = LeavingClient(gone)
        response = await synthesize(None, ScriptedGateway(handle), speech(), RATE, meter)  # type: ignore[arg-type]
        with contextlib.suppress(Exception):  # how the server learns the client is gone: not what is tested
            await response({"type": "http", "asgi": {"spec_version": spec_version}}, client.receive, client.send)
        assert (handle.closed, meter.finished) == (1, ["CANCELLED"])  # the body is still unfinalized here

    asyncio.run(asyncio.wait_for(scenario(), 5))


def test_a_request_failed_by_a_worker_going_down_carries_retry_after_as_starting_does():
    """Before: a 503 `unavailable` right after a worker crash had neither Retry-After nor X-Should-Retry, while the
    refusals of a starting daemon carry Retry-After."""
    failure = RequestFailed("UNAVAILABLE", "its worker went down; retry", request_id="r-4", retry_after=3)
    for gateway in (ScriptedGateway(refusal=failure), ScriptedGateway(ScriptedHandle([], failure))):
        error = api_error(gateway, speech(), Meter())
        assert (error.status, error.code) == (503, "unavailable")
        assert error.headers == {"X-Request-Id": "r-4", "Retry-After": "3"}


@pytest.mark.parametrize(
    "field, param",
    [("voice", "voice"), ("instructions", "instructions"), ("reference_audio", "ref_audio"), ("text", "input")],
)
def test_the_field_a_stage_names_is_the_errors_param_in_the_http_apis_name_for_it(field, param):
    """Before: `param` was null for every stage refusal but one whose message quoted an option's key."""
    failure = RequestFailed("INVALID_ARGUMENT", "no", request_id="r-5", code="QWEN3_X", field=field)
    error = api_error(ScriptedGateway(ScriptedHandle([], failure)), speech(options={"top_k": "5"}), Meter())
    assert (error.status, error.param, error.code) == (400, param, "QWEN3_X")


def test_the_field_a_stage_names_reaches_the_sse_error_event():
    handle = ScriptedHandle([audio_chunk(10)], RequestFailed("INVALID_ARGUMENT", "no", code="X_Y", field="voice"))
    with client_for(ScriptedGateway(handle), speech(stream_format="sse")) as client:
        response = client.post("/speech")
    error = events(response.content)[-1]["error"]
    assert (error["param"], error["code"]) == ("voice", "X_Y")
