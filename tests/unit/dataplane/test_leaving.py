"""A stopping worker's Leaving frame: the requests whose work there ended go on when its link breaks, and those it
still held fail at once in its words (before, every request routed through it failed as "became unreachable").
Every peer linked to it hears it, so a sender ends its link and the worker reads what was sent before (`settle`)."""

from __future__ import annotations

import asyncio

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.client_failures import worker_stopped
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.routing import GATEWAY_PEER
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.fakes import FakeInboundLink, RecordedLinks, outcome, poll_until
from tests.unit.dataplane.runtime_driver import Record, make_runtime, planned, submit

ENTRY = "unix:/nonexistent/pipeline.sock"
VOCODER = "unix:/nonexistent/vocoder.sock"


class Holds:
    """A stage that holds its request until cancelled."""

    async def process(self, payload, ctx):
        await asyncio.sleep(3600)


def test_a_stopping_worker_tells_every_linked_peer_which_requests_ended_here_and_which_it_failed():
    async def scenario():
        runtime = make_runtime(
            [planned("quick", next=["later"]), planned("held")],
            {"quick": Record({}), "held": Holds()},
            routes={"later": VOCODER},
        )
        gateway, other = FakeInboundLink(GATEWAY_PEER), FakeInboundLink("vocoder")
        for link in (gateway, other):
            runtime.on_hello(link)
        submit(runtime, "quick", request_id="done-here")
        submit(runtime, "held", request_id="held-here")
        assert await poll_until(lambda: runtime.in_flight() == 1)
        await runtime.drain(0.0)
        return gateway.replies, other.replies

    to_gateway, to_other = asyncio.run(scenario())
    (leaving,) = [frame.leaving for frame in to_gateway if frame.WhichOneof("body") == "leaving"]
    assert (list(leaving.finished), list(leaving.failed)) == (["done-here"], ["held-here"])
    assert leaving.message == worker_stopped(["held", "quick"])
    # Another worker's link too: a sender that routed a request here before it knew must end its link, so that
    # its frames are read (and the request refused) instead of dropped unread when the server stops.
    assert [frame.leaving for frame in to_other if frame.WhichOneof("body") == "leaving"] == [leaving]


def test_a_link_dialled_after_the_worker_left_hears_it_at_once_and_settle_waits_for_links_to_end():
    async def scenario():
        runtime = make_runtime([planned("quick")], {"quick": Record({})})
        early = FakeInboundLink("pipeline")
        runtime.on_hello(early)
        await runtime.drain(0.0)
        late = FakeInboundLink("pipeline")
        runtime.on_hello(late)  # a sender re-dialling the address after it heard: told again, at once
        settled_open = await runtime.settle(0.05)  # both links still open: it waits, then says so
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, runtime.on_inbound_closed, early)
        loop.call_later(0.1, runtime.on_inbound_closed, late)
        started = loop.time()
        settled = await runtime.settle(5.0)
        return early.replies, late.replies, settled_open, settled, loop.time() - started

    early, late, settled_open, settled, waited = asyncio.run(scenario())
    assert [f.WhichOneof("body") for f in early] == ["leaving"] and late == early
    assert settled_open is False
    assert settled is True and 0.09 < waited < 2.0


def test_a_closed_gateway_link_is_not_told_and_the_finished_list_is_bounded(monkeypatch):
    monkeypatch.setattr("stagevisor.supervisor.dataplane.request_state.RECENT_FINISHED", 3)

    async def scenario():
        runtime = make_runtime([planned("quick")], {"quick": Record({})})
        gateway = FakeInboundLink(GATEWAY_PEER)
        runtime.on_hello(gateway)
        runtime.on_inbound_closed(gateway)
        for index in range(5):
            submit(runtime, "quick", request_id=f"r{index}")
            assert await poll_until(lambda: runtime.in_flight() == 0)
        finished = runtime.requests.finished()
        await runtime.drain(0.0)
        return gateway.replies, finished

    replies, finished = asyncio.run(scenario())
    assert replies == [] and finished == ["r2", "r3", "r4"]


def test_the_gateway_fails_what_a_leaving_worker_held_in_its_words_and_spares_what_ended_there(tmp_path):
    plan = plan_placement(PlacementRequest("demo", isolate_stages=("vocoder",)))
    routes = {s.name: VOCODER if s.name == "vocoder" else ENTRY for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    links = gateway.links = RecordedLinks()
    spared, held, unsaid = (gateway.open({"text": "Hello there."}) for _ in range(3))
    message = worker_stopped(["preprocessing", "tts_engine"])
    entry = links.get(ENTRY)
    entry.left = frozenset({spared.request_id})  # what the link keeps of the Leaving frame it read
    gateway.on_reply(
        pb.Frame(leaving=pb.Leaving(finished=[spared.request_id], failed=[held.request_id], message=message))
    )
    gateway.on_link_broken(entry, ConnectionResetError())
    assert not spared.ended  # it goes on in the vocoder's worker
    failure = asyncio.run(outcome(held))
    assert isinstance(failure, RequestFailed) and failure.status == "UNAVAILABLE" and message in str(failure)
    unreachable = asyncio.run(outcome(unsaid))  # a request the worker said nothing of fails with its link
    assert isinstance(unreachable, RequestFailed) and "became unreachable" in str(unreachable)
