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
