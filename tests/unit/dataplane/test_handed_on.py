"""Requests a stopped sender handed on to a replica: it tells the gateway where, and the gateway fails them if that
replica is lost (before, no one knew, and they waited for --pipeline-idle-timeout)."""

from __future__ import annotations

import asyncio


from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.errors import RequestFailed
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.unit.dataplane.client_reading import read_failure
from tests.unit.dataplane.runtime_driver import handed_on_to_a_replica
from tests.unit.dataplane.runtime_driver import SINK

ENTRY = "unix:/nonexistent/pipeline.sock"
VOCODER, VOCODER_1 = "unix:/nonexistent/vocoder.sock", "unix:/nonexistent/vocoder-1.sock"


def test_a_router_lists_its_recent_picks_by_replica_oldest_first():
    router = ReplicaRouter({"g": ("a", "b")})
    for request in ("r1", "r2", "r3", "r4"):
        router.choose("g", request)
    router.set_ready("g", ())
    router.choose("g", "r5")  # to the group's own address, for want of a replica taking requests
    assert router.picks_by_replica() == {"a": ["r1", "r3"], "b": ["r2", "r4"], "g": ["r5"]}


def test_announcing_a_retired_replica_again_says_it_is_back():
    router = ReplicaRouter({"g": ("g", "r1")})
    assert router.set_ready("g", ("g",)) == set()  # r1 out of rotation
    assert router.set_ready("g", ("g", "r1")) == {"r1"}  # a new worker at r1's address
    assert router.set_ready("g", ("g", "r1")) == set()


def test_a_stopping_worker_tells_the_gateway_where_it_handed_requests_on_after_failing_what_it_held():
    async def scenario():
        runtime, group, replica = await handed_on_to_a_replica()
        await runtime.drain(0.0)
        reports = [f.handed_on for f in runtime.links.sent[SINK] if f.WhichOneof("body") == "handed_on"]
        assert [(r.replica, list(r.request_ids)) for r in reports] == [(replica, ["r1"])]

    asyncio.run(scenario())


def test_a_worker_that_routed_nothing_to_replicas_reports_nothing_as_it_stops():
    async def scenario():
        runtime, _, _ = await handed_on_to_a_replica()
        runtime.router.forget("unix:/b1.sock")
        await runtime.drain(0.0)
        assert [f.WhichOneof("body") for f in runtime.links.sent.get(SINK, [])] == []

    asyncio.run(scenario())


def gateway_with(tmp_path, *request_ids: str) -> Gateway:
    """The demo's gateway (a single entry worker, the vocoder in two replicas) with `request_ids` in flight."""
    plan = plan_placement(PlacementRequest("demo", isolate_stages=("vocoder",)))
    routes = {s.name: VOCODER if s.name == "vocoder" else ENTRY for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    gateway.push_replicas({VOCODER: (VOCODER, VOCODER_1)}, (), {})
    for request_id in request_ids:
        gateway.requests[request_id] = RequestHandle(gateway, request_id, 1)
    return gateway


def handed_on(gateway: Gateway, replica: str, *request_ids: str) -> None:
    """The frame a stopping worker sends the gateway's sink."""
    frame = pb.Frame(handed_on=pb.HandedOn(replica=replica, request_ids=list(request_ids)))
    gateway._on_frame(frame, None)  # type: ignore[arg-type]  # the link matters to chunks only


def failure(handle: RequestHandle) -> RequestFailed | None:
    """How the request ended for its client (None: it has not ended): what reading the handle raises, as the public
    endpoints read it."""
    return read_failure(handle) if handle.ended else None


def test_a_lost_replica_fails_the_requests_a_stopped_worker_handed_on_to_it_naming_the_stage(tmp_path):
    gateway = gateway_with(tmp_path, "r1", "r2", "r3")
    handed_on(gateway, VOCODER_1, "r1", "r2", "gone")  # "gone" ended before the report: nothing to watch
    handed_on(gateway, VOCODER, "r3")
    gateway.push_replicas({VOCODER: (VOCODER,)}, (VOCODER_1,), {})
    failed = {r: failure(h) for r, h in gateway.requests.items()}
    assert failed["r3"] is None
    assert {(e.status, e.stage) for e in (failed["r1"], failed["r2"]) if e is not None} == {("UNAVAILABLE", "vocoder")}
    assert "the replica that held it went down; retry" in str(failed["r1"])


def test_a_request_that_ended_before_the_report_is_not_watched(tmp_path):
    gateway = gateway_with(tmp_path, "r1")
    handle = gateway.requests["r1"]
    handle.fail("INTERNAL", "the stage failed")
    handed_on(gateway, VOCODER_1, "r1")
    assert handle.handed_to == frozenset()


def test_a_replica_announced_again_after_a_clean_stop_fails_none_of_what_its_old_worker_was_handed(tmp_path):
    """A rolling restart: vocoder-1's old worker finished (or handed further on) what a stopped sender gave it; the
    loss of the new worker at its address must not fail those requests."""
    gateway = gateway_with(tmp_path, "r1")
    handed_on(gateway, VOCODER_1, "r1")
    gateway.push_replicas({VOCODER: (VOCODER,)}, (), {})  # out of rotation, then stopped on purpose
    gateway.push_replicas({VOCODER: (VOCODER, VOCODER_1)}, (), {})  # the new worker is READY
    gateway.push_replicas({VOCODER: (VOCODER,)}, (VOCODER_1,), {})  # and dies
    assert failure(gateway.requests["r1"]) is None


def test_a_report_that_comes_after_its_replica_was_lost_fails_those_requests_at_once(tmp_path):
    """The replica died while the stopped sender's report was on its way: nothing would fail them later."""
    gateway = gateway_with(tmp_path, "r1", "r2")
    gateway.push_replicas({VOCODER: (VOCODER,)}, (VOCODER_1,), {})  # vocoder-1 dies
    handed_on(gateway, VOCODER_1, "r1")
    handed_on(gateway, VOCODER, "r2")
    error = failure(gateway.requests["r1"])
    assert error is not None and (error.status, error.stage) == ("UNAVAILABLE", "vocoder")
    assert failure(gateway.requests["r2"]) is None


def test_a_report_naming_a_lost_replica_a_new_worker_has_taken_since_fails_nothing_at_once(tmp_path):
    gateway = gateway_with(tmp_path, "r1")
    gateway.push_replicas({VOCODER: (VOCODER,)}, (VOCODER_1,), {})  # vocoder-1 dies
    gateway.push_replicas({VOCODER: (VOCODER, VOCODER_1)}, (), {})  # a new worker at its address is READY
    handed_on(gateway, VOCODER_1, "r1")
    assert failure(gateway.requests["r1"]) is None
    gateway.push_replicas({VOCODER: (VOCODER,)}, (VOCODER_1,), {})  # and if that one dies, r1 fails with it
    assert failure(gateway.requests["r1"]) is not None
