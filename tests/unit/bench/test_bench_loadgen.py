"""The load generator against fake requests and channels: when its loops issue, and when they stop."""

from __future__ import annotations

import asyncio
import random

import pytest

from stagevisor.supervisor.bench.loadgen import Outcome, open_loop

ISSUE_CAP = 20_000
"""Arrivals the fake schedule allows before it calls the run endless (far above what 0.05 s can issue)."""


class TinyGaps(random.Random):
    """The schedule of an absurd rate (`--rate 1e308`): arrivals 1e-308 s apart, which never add up to a second."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self.arrivals = 0

    def expovariate(self, lambd: float) -> float:
        self.arrivals += 1
        if self.arrivals > ISSUE_CAP:
            raise AssertionError(f"{ISSUE_CAP} arrivals and the run goes on: the schedule never reaches --duration")
        return 1e-308


def test_an_open_loop_at_a_rate_it_cannot_issue_still_ends_with_its_duration(monkeypatch):
    """`stagevisor bench --rate 1e308 --duration 1` spun forever: arrival times never reached the duration, the
    loop never yielded, and no request ran. It ends on the clock, and the requests it issued run meanwhile."""
    monkeypatch.setattr(random, "Random", TinyGaps)  # the generator draws its arrivals from random.Random(seed)
    ran: list[int] = []

    async def request(index: int, text: str) -> Outcome:
        ran.append(index)
        await asyncio.sleep(0)
        return Outcome(index, 0.0, 0.0, 0.0, 0, 24000, None, "")

    outcomes, wall = asyncio.run(open_loop(request, ["a text"], 1e308, duration=0.05))
    assert ran and len(outcomes) == len(ran)
    assert wall < 5


def test_a_ctrl_c_that_a_grpc_call_swallows_still_stops_the_load():
    """
    grpc.aio returns a call's response when the RPC completes just as the task awaiting it is cancelled: the
    task it awaits catches the cancellation. Ctrl-C cancels the bench's main task, so without a check the
    interrupt was lost and the bench ran every request to its end (and exited 0).
    1. a closed loop of 1,000 requests whose every awaited call swallows a cancellation that reaches it;
    2. the loop is cancelled after a few requests: it stops with CancelledError, having run only those.
    """
    from types import SimpleNamespace

    from stagevisor.supervisor.bench.loadgen import GrpcClient, closed_loop

    async def answered() -> bytes:  # what grpc.aio awaits: its cancellation is caught, the response returned
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            pass
        return b"\0\0"

    class Call:
        def __init__(self) -> None:
            self.done = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            if self.done:
                raise StopAsyncIteration
            self.done = True
            pcm = await asyncio.ensure_future(answered())
            return SimpleNamespace(pcm=pcm, sample_rate=24000)

    async def scenario():
        client = GrpcClient(
            "unix:/nonexistent.sock", {}, stub=SimpleNamespace(Synthesize=lambda request, timeout: Call())
        )
        issued = []
        load = asyncio.ensure_future(closed_loop(client.request, ["hi"], 1, requests=1000, progress=issued.append))
        await asyncio.sleep(0.1)
        load.cancel()
        try:
            await asyncio.wait_for(load, 5)
        except asyncio.CancelledError:
            return "stopped", len(issued)
        finally:
            await client.close()
        return "ran to its end", len(issued)

    outcome, done = asyncio.run(scenario())
    assert outcome == "stopped" and done < 100


def test_a_daemon_that_stops_answering_ends_the_run_instead_of_failing_requests_in_a_tight_loop(tmp_path):
    """
    `bench --address` against a daemon killed mid-run sent tens of thousands of requests, each failing at once
    UNAVAILABLE, until --duration ran out, then exited 0.
    1. two clients on a channel to a unix socket nothing listens on (the daemon gone), for up to 30 s;
    2. the first failures wait for the channel to connect again, which it does not within the wait;
    3. the run ends with Unreachable naming the address, after a handful of requests.
    """
    from stagevisor.supervisor.bench.loadgen import GrpcClient, Unreachable, closed_loop

    address = f"unix:{tmp_path / 'gone.sock'}"
    issued: list[int] = []

    async def scenario() -> None:
        client = GrpcClient(address, {}, reconnect_wait=0.2)
        try:
            await closed_loop(client.request, ["hi"], 2, duration=30, progress=issued.append)
        finally:
            await client.close()

    with pytest.raises(Unreachable, match=f"the daemon at {address} does not answer"):
        asyncio.run(asyncio.wait_for(scenario(), 20))
    assert len(issued) <= 4


def test_an_unavailable_the_daemon_sends_on_a_connected_channel_counts_as_a_failed_request():
    """A daemon that is starting (or lost a worker) answers UNAVAILABLE itself: that is a refusal to count, as
    RESOURCE_EXHAUSTED is, and the run goes on."""
    from types import SimpleNamespace

    import grpc

    from stagevisor.supervisor.bench.loadgen import GrpcClient

    class Refusing:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "the daemon is starting")

    class Connected:
        def get_state(self, try_to_connect=False):
            return grpc.ChannelConnectivity.READY

        async def close(self):
            pass

    async def scenario():
        client = GrpcClient(
            "unix:/nonexistent.sock",
            {},
            channel=Connected(),
            stub=SimpleNamespace(Synthesize=lambda request, timeout: Refusing()),
        )
        return await client.request(0, "hi")

    outcome = asyncio.run(scenario())
    assert outcome.error == "UNAVAILABLE" and outcome.detail == "the daemon is starting"


def test_an_open_loop_stops_issuing_once_a_request_raises():
    """The open loop issued arrivals until --duration whatever its requests raised: one Unreachable ends it."""
    from stagevisor.supervisor.bench.loadgen import Unreachable

    ran: list[int] = []

    async def request(index: int, text: str) -> Outcome:
        ran.append(index)
        await asyncio.sleep(0.01)
        raise Unreachable("the daemon at unix:/x does not answer")

    async def scenario():
        return await asyncio.wait_for(open_loop(request, ["a text"], 200, duration=30), 10)

    with pytest.raises(Unreachable):
        asyncio.run(scenario())
    assert len(ran) < 50


def test_every_request_carries_the_clients_voice_and_reference():
    """`bench --reference-audio` on a Base checkpoint: each request must carry the clip, or every one is refused."""
    from types import SimpleNamespace

    from stagevisor.supervisor.bench.loadgen import GrpcClient, VoiceFields

    sent = []

    class Empty:
        def __aiter__(self):
            return self

        async def __anext__(self):
            raise StopAsyncIteration

    async def scenario():
        client = GrpcClient(
            "unix:/nonexistent.sock",
            {"seed": "1"},
            voice=VoiceFields("v", b"RIFF", "T"),
            stub=SimpleNamespace(Synthesize=lambda request, timeout: sent.append(request) or Empty()),
        )
        try:
            await client.request(0, "hi")
        finally:
            await client.close()

    asyncio.run(scenario())
    [request] = sent
    assert (request.text, request.voice, request.reference_audio, request.reference_transcript) == (
        "hi",
        "v",
        b"RIFF",
        "T",
    )
    assert dict(request.options) == {"seed": "1"}
