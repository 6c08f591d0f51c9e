"""The Synthesis service: what a client learns when a request fails (a code, the stage, a request id; never
exception text), and which entry serves a request."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor.dataplane.synthesis import SynthesisServicer
from stagevisor.supervisor.errors import RequestFailed
from tests.fakes import Aborted, FakeServicerContext, ScriptedGateway, ScriptedHandle

SECRET = "password=hunter2"
DAEMON_FAILED = "the daemon failed with {}; the daemon log has the details"


def streaming(chunk, then_wait: bool = False) -> ScriptedGateway:
    """A gateway whose request "0123abcd" streams `chunk` (then, with `then_wait`, nothing until it is cancelled)."""
    return ScriptedGateway(ScriptedHandle([chunk], request_id="0123abcd", then_wait=then_wait))


class Unprintable:
    def __float__(self):
        raise ValueError(f"cannot convert: {SECRET}")


async def drain(servicer, context):
    await servicer.Synthesize(spb.SynthesizeRequest(text="hello"), context)


def test_an_unexpected_error_serving_a_request_is_internal_with_the_request_id_and_no_exception_text(caplog):
    gateway = streaming({"audio": [Unprintable()], "sample_rate": 22050})
    with caplog.at_level(logging.ERROR), pytest.raises(Aborted) as raised:
        asyncio.run(drain(SynthesisServicer(lambda: gateway), FakeServicerContext()))
    assert raised.value.code == grpc.StatusCode.INTERNAL
    assert raised.value.details.endswith("(request 0123abcd)")
    assert SECRET not in raised.value.details
    assert raised.value.trailing_metadata == {"stagevisor-request-id": "0123abcd"}
    assert raised.value.details == f"{DAEMON_FAILED.format('ValueError')} (request 0123abcd)"
    assert gateway.handle.closed
    assert "request 0123abcd failed in the daemon" in caplog.text and SECRET in caplog.text


def test_an_unexpected_error_before_the_request_streams_is_internal_with_a_fresh_request_id_and_no_text(caplog):
    """Unhandled, grpc.aio would send the client `Unexpected <class 'OSError'>: <the text>`."""
    broken = ScriptedGateway(refusal=OSError(f"/srv/stagevisor/{SECRET}/pool is not writable"))  # its text names a path
    with caplog.at_level(logging.ERROR), pytest.raises(Aborted) as raised:
        asyncio.run(drain(SynthesisServicer(lambda: broken), FakeServicerContext()))
    request_id = raised.value.trailing_metadata["stagevisor-request-id"]
    assert raised.value.code == grpc.StatusCode.INTERNAL and len(request_id) == 32
    assert raised.value.details == f"{DAEMON_FAILED.format('OSError')} (request {request_id})"
    assert f"request {request_id} failed in the daemon" in caplog.text and SECRET in caplog.text


def test_each_request_goes_to_the_entry_current_at_its_start_and_its_timings_name_that_topology_groups():
    import time

    import numpy as np

    chunk = {"audio": np.zeros(240, np.float32), "sample_rate": 24000}
    before, after = streaming(chunk), streaming(chunk)
    before.stage_groups, after.stage_groups = {"vocoder": "pipeline"}, {"vocoder": "vocoder"}
    current = [before]
    servicer = SynthesisServicer(lambda: current[0])

    def groups_in_timings(gateway: ScriptedGateway) -> dict[str, str]:
        now = time.monotonic()
        gateway.handle.timings = [("vocoder", now, now + 0.01)]  # what the terminal stage reported
        context = FakeServicerContext()
        asyncio.run(servicer.Synthesize(spb.SynthesizeRequest(text="hello", timings=True), context))
        *audio, last = context.written
        assert [len(message.pcm) for message in audio] == [480] and last.HasField("timings")
        assert gateway.handle.closed and gateway.payloads[-1]["timings"] is True  # asked, with metrics off
        return {timing.stage: timing.group for timing in last.timings.stages}

    assert groups_in_timings(before) == {"vocoder": "pipeline"} and not after.payloads
    current[0] = after  # a topology applied live: the daemon's gateway is a new one
    assert groups_in_timings(after) == {"vocoder": "vocoder"} and len(before.payloads) == 1


class DeadlineContext(FakeServicerContext):
    """A call whose client set a deadline `remaining` seconds away (None: no deadline)."""

    def __init__(self, remaining: float | None) -> None:
        super().__init__()
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


@pytest.mark.parametrize(
    ("remaining", "code"), [(-0.001, "DEADLINE_EXCEEDED"), (None, "CANCELLED"), (5.0, "CANCELLED")]
)
def test_a_call_cancelled_mid_stream_counts_under_the_code_its_client_got(remaining, code):
    """gRPC cancels the handler both when the client cancels and when the client's deadline passes; the
    request counter says which one the client saw, and neither is a success."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stagevisor.supervisor.metrics.registry import DaemonMetrics

    gateway = streaming({"audio": [0.0] * 160, "sample_rate": 16000}, then_wait=True)
    gateway.metrics = DaemonMetrics("m", {})
    context = DeadlineContext(remaining)

    async def scenario() -> None:
        call = asyncio.ensure_future(drain(SynthesisServicer(lambda: gateway), context))
        while not context.written:
            await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(scenario())
    requests = {
        s.labels["code"]: s.value
        for family in text_string_to_metric_families(generate_latest(gateway.metrics.registry).decode())
        for s in family.samples
        if s.name == "stagevisor_requests_total"
    }
    assert requests == {code: 1}
    assert gateway.handle.closed


class UnreadContext(FakeServicerContext):
    """A call whose client stopped reading: each write stays pending until the client goes away."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled: list[asyncio.Future] = []

    async def write(self, message) -> None:
        self.stalled.append(asyncio.get_running_loop().create_future())
        await self.stalled[-1]

    def time_remaining(self) -> float | None:
        return None


def test_a_request_ended_for_a_client_that_stopped_reading_leaves_the_in_flight_gauge_at_once():
    """The stream-idle timeout ends the request in the pipeline, but gRPC sends its status only once the client
    reads again or goes away, which it may never do: the request is counted as ended (DEADLINE_EXCEEDED) and out
    of flight from the timeout on, not from whenever the client disconnects."""
    from dataclasses import replace

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stagevisor.supervisor.metrics.registry import DaemonMetrics

    gateway = streaming({"audio": [0.0] * 160, "sample_rate": 16000}, then_wait=True)
    gateway.limits = replace(gateway.limits, stream_idle_timeout=0.05)
    gateway.metrics = DaemonMetrics("m", {})
    context = UnreadContext()

    def samples() -> dict:
        text = generate_latest(gateway.metrics.registry).decode()
        return {
            (s.name, s.labels.get("code")): s.value for f in text_string_to_metric_families(text) for s in f.samples
        }

    async def scenario() -> dict:
        call = asyncio.ensure_future(
            SynthesisServicer(lambda: gateway).Synthesize(spb.SynthesizeRequest(text="hi"), context)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0  # the timeout is 0.05 s; the bound only stops a broken run
        while ("stagevisor_requests_total", "DEADLINE_EXCEEDED") not in samples() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        seen = samples()
        assert not call.done()  # still waiting for the client to read or go away
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        return seen

    seen = asyncio.run(scenario())
    assert seen[("stagevisor_requests_in_flight", None)] == 0
    assert seen[("stagevisor_requests_total", "DEADLINE_EXCEEDED")] == 1
    after = samples()
    assert (
        after[("stagevisor_requests_total", "DEADLINE_EXCEEDED")] == 1
        and ("stagevisor_requests_total", "CANCELLED") not in after
    )


class GoneContext(FakeServicerContext):
    """A call whose client disconnected while a write was in flight: gRPC fails the write, not the handler."""

    async def write(self, message) -> None:
        raise RuntimeError('Failed "execute_batch": (<SendMessageOperation>,)')  # grpc's ExecuteBatchError

    def cancelled(self) -> bool:
        return True

    def time_remaining(self) -> float | None:
        return 5.0


def test_a_client_that_disconnects_during_a_write_is_a_cancel_not_an_internal_error(caplog):
    """The request counts as CANCELLED, nothing is logged as a daemon failure, and no status is sent
    to a client that is gone."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from stagevisor.supervisor.metrics.registry import DaemonMetrics

    gateway = streaming({"audio": [0.0] * 160, "sample_rate": 16000})
    gateway.metrics = DaemonMetrics("m", {})
    with caplog.at_level(logging.ERROR):
        asyncio.run(drain(SynthesisServicer(lambda: gateway), GoneContext()))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    requests = {
        s.labels["code"]: s.value
        for family in text_string_to_metric_families(generate_latest(gateway.metrics.registry).decode())
        for s in family.samples
        if s.name == "stagevisor_requests_total"
    }
    assert requests == {"CANCELLED": 1}
    assert gateway.handle.closed


def test_a_request_failed_by_a_worker_going_down_carries_the_retry_pushback_as_starting_does():
    """gRPC's side of HTTP's Retry-After: the `grpc-retry-pushback-ms` trailer admission's STARTING refusal sends."""
    failure = RequestFailed("UNAVAILABLE", "its worker went down; retry", request_id="r-4", retry_after=3)
    for gateway in (ScriptedGateway(refusal=failure), ScriptedGateway(ScriptedHandle([], failure))):
        with pytest.raises(Aborted) as raised:
            asyncio.run(drain(SynthesisServicer(lambda gateway=gateway: gateway), FakeServicerContext()))
        assert raised.value.code == grpc.StatusCode.UNAVAILABLE
        assert raised.value.trailing_metadata == {"stagevisor-request-id": "r-4", "grpc-retry-pushback-ms": "3000"}
