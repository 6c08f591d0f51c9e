"""The load generator's open loop (Poisson arrivals) against a fake request: when it issues, and when it stops."""

from __future__ import annotations

import asyncio
import random

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
        client = GrpcClient("unix:/nonexistent.sock", {})
        client._stub = SimpleNamespace(Synthesize=lambda request, timeout: Call())
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
