"""POST /v1/audio/speech/batch before any item runs: the body's shape, and an item that is not a request."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from stagevisor.supervisor.http.batch import MAX_BATCH, HeldAudio, batch_items, run_item
from stagevisor.supervisor.http.errors import ApiError
from tests.fakes import LeavingClient


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"requests": [{}], "model": "demo"}, "model", "unknown_parameter"),
        ({"requests": []}, "requests", "invalid_value"),
        ({"requests": {"input": "hi"}}, "requests", "invalid_value"),
        ({}, "requests", "missing_required_parameter"),  # as a speech request without `input`
        ({"requests": [{}] * (MAX_BATCH + 1)}, "requests", "invalid_value"),
    ],
)
def test_a_malformed_batch_is_refused_whole_naming_the_field_with_a_code(body, param, code):
    with pytest.raises(ApiError) as caught:
        batch_items(body)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)


def test_an_item_that_is_not_an_object_gets_its_own_coded_400_line():
    def never(*args):
        raise AssertionError("an item that is not an object is never parsed or run")

    line = asyncio.run(run_item(3, 5, never, never, never, None))  # type: ignore[arg-type]
    assert line == {
        "index": 3,
        "status": 400,
        "error": {
            "message": "requests[3] must be a JSON object, got a number",
            "type": "invalid_request_error",
            "param": "requests[3]",
            "code": "invalid_type",
        },
    }


def test_an_item_asking_for_sse_gets_its_own_400_line_instead_of_plain_audio():
    """A batch line holds the whole audio: stream_format "sse" was ignored without a word."""
    from stagevisor.supervisor.http.request import SpeechRequest

    async def parse(item):
        return SpeechRequest(model="demo", input="Hi.", stream_format=item["stream_format"]), None

    def never(*args):
        raise AssertionError("an item refused before it runs opens no request")

    line = asyncio.run(run_item(2, {"stream_format": "sse"}, parse, never, never, None))  # type: ignore[arg-type]
    assert (line["status"], line["error"]["param"], line["error"]["code"]) == (400, "stream_format", "invalid_value")
    # The line's index names the item, as for every other item error (only these messages repeated it).
    assert line["error"]["message"].startswith("stream_format 'sse' does not apply to a batch")


def test_an_item_that_fails_in_the_daemon_gets_its_own_500_line_with_the_class_and_a_request_id(caplog):
    """A daemon bug in one item used to escape run_item and cut the whole NDJSON response."""

    async def broken_parse(item):
        raise OSError("/srv/stagevisor/voices/secret-token is unreadable")

    with caplog.at_level("ERROR", logger="stagevisor.supervisor.http.batch"):
        line = asyncio.run(run_item(1, {"input": "hi"}, broken_parse, None, None, None))  # type: ignore[arg-type]
    error = line["error"]
    request_id = error["message"].rpartition("(request ")[2].rstrip(")")
    assert (line["index"], line["status"], error["type"], error["code"]) == (1, 500, "server_error", "internal_error")
    assert error["message"] == f"the daemon failed with OSError; the daemon log has the details (request {request_id})"
    assert f"request {request_id}: batch item 1 failed in the daemon" in caplog.text and "secret-token" in caplog.text


@pytest.mark.parametrize(
    "spec_version, gone",
    [
        ("2.3", "stalled"),  # uvicorn: the client stops reading, then leaves; Starlette cancels the stalled write
        ("2.4", "start"),  # the response start fails: the body never runs
    ],
)
def test_the_items_still_running_when_a_batch_response_ends_are_cancelled(spec_version, gone):
    """A batch whose client went away: the items still running are cancelled (each closes its request) when the
    response's call ends, not when the garbage collector finalizes a body left suspended in a write, or never
    for a body that never ran; meanwhile up to MAX_BATCH requests would run on, their slots taken, for nobody."""
    from stagevisor.supervisor.http.batch import batch_response

    async def scenario() -> list[bool]:
        async def first() -> dict:
            return {"index": 0, "status": 200}  # done at once: its line is the write the client leaves during

        tasks = [asyncio.ensure_future(first())] + [asyncio.ensure_future(asyncio.Event().wait()) for _ in range(3)]
        client = LeavingClient(gone)
        response = batch_response(tasks, 60.0, HeldAudio())
        with contextlib.suppress(Exception):  # how the server learns the client is gone: not what is tested
            await response({"type": "http", "asgi": {"spec_version": spec_version}}, client.receive, client.send)
        return [task.cancelled() for task in tasks[1:]]

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == [True, True, True]


def test_a_batch_whose_client_reads_nothing_for_the_idle_timeout_ends_its_items_and_its_response():
    """A client that stays connected and reads nothing: the speech API's writes are bounded by
    --stream-idle-timeout, a batch's were not, and it held its results (up to MAX_BATCH items of audio) for as long
    as the client kept the connection. Its connection is then reset: closed, it stayed open until the client read
    what was buffered for it or left."""
    from stagevisor.supervisor.http import backlog
    from stagevisor.supervisor.http.batch import batch_response
    from stagevisor.supervisor.http.speech import StreamAborted

    class Connection:
        aborted = False

        def get_write_buffer_size(self) -> int:
            return 1 << 20  # what the client left unread: it never falls

        def get_extra_info(self, name: str) -> None:
            return None

        def abort(self) -> None:
            self.aborted = True

    class Stuck:
        writes: list[str] = []

        async def send(self, message: dict) -> None:
            self.writes.append(message["type"])
            if message["type"] == "http.response.body":
                await asyncio.Event().wait()  # the write never leaves

        async def receive(self) -> dict:
            await asyncio.Event().wait()  # and the client never goes away
            return {}

    async def scenario() -> list[bool]:
        async def first() -> dict:
            return {"index": 0, "status": 200}

        tasks = [asyncio.ensure_future(first())] + [asyncio.ensure_future(asyncio.Event().wait()) for _ in range(3)]
        client, connection = Stuck(), Connection()
        with backlog.serving(connection), pytest.raises(StreamAborted, match="the client read nothing for 0.05 s"):
            await batch_response(tasks, 0.05, HeldAudio())(
                {"type": "http", "asgi": {"spec_version": "2.3"}}, client.receive, client.send
            )
        assert client.writes == ["http.response.start", "http.response.body"]
        assert connection.aborted
        return [task.cancelled() for task in tasks[1:]]

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == [True, True, True]


async def pcm_request(item) -> tuple:
    """What the served model's parse makes of any item: a request for 16-bit PCM."""
    from stagevisor.supervisor.http.request import SpeechRequest

    return SpeechRequest(model="demo", input="Hi.", response_format="pcm"), None


def test_an_item_whose_audio_passes_the_batch_cap_gets_its_own_400_line_and_holds_nothing():
    """One batch of 12 long texts held about 500 MB in the daemon (64 items of up to --max-audio-seconds each fit
    in a body): a batch now holds at most MAX_BATCH_AUDIO_BYTES of audio at once."""
    from tests.fakes import ScriptedGateway, ScriptedHandle, audio_chunk

    handle = ScriptedHandle([audio_chunk(24000)] * 3)  # 3 s at 24 kHz: 144,000 bytes of 16-bit PCM
    held = HeldAudio(limit=100_000)
    line = asyncio.run(run_item(4, {}, pcm_request, ScriptedGateway(handle), lambda served: 24000, None, held))
    assert (line["index"], line["status"]) == (4, 400)
    assert (line["error"]["code"], line["error"]["param"]) == ("audio_limit_exceeded", "requests[4]")
    assert line["error"]["message"].startswith(
        "the batch's audio passed 0.0953674 MiB held at once, its cap; send long texts alone"
    )
    assert held.held == 0 and handle.closed == 1  # what it held is given back, and its request ends


def test_an_item_holds_its_audio_until_its_line_is_sent():
    from stagevisor.supervisor.http.batch import stream_results
    from tests.fakes import ScriptedGateway, ScriptedHandle, audio_chunk

    async def scenario() -> list[int]:
        held = HeldAudio(limit=200_000)
        gateway = ScriptedGateway(ScriptedHandle([audio_chunk(24000)] * 3))
        task = asyncio.ensure_future(run_item(0, {}, pcm_request, gateway, lambda served: 24000, None, held))
        await asyncio.wait([task])
        counts = [held.held]  # done, its line not yet sent
        async for line in stream_results([task], held):
            assert line.startswith(b'{"index":0,"status":200,')
            counts.append(held.held)  # yielded: on its way out, still held
        counts.append(held.held)
        return counts

    assert asyncio.run(asyncio.wait_for(scenario(), 5)) == [144_000, 144_000, 0]
    # And two such items do not fit under a cap of 200,000 bytes at once, whichever finishes first.
    held = HeldAudio(limit=200_000)
    held.take(0, 144_000)
    with pytest.raises(ApiError):
        held.take(1, 144_000)
    held.release(0)
    held.take(1, 144_000)
    assert held.held == 144_000
