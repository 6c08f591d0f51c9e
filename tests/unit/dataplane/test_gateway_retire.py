"""A gateway retired by a live topology change hands new requests to its successor and leaves shared admission be."""

import asyncio

import pytest

from stagevisor.supervisor.dataplane.admission import Admission, AdmissionRejected
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


class Successor:
    def __init__(self):
        self.submitted = []

    async def submit(self, request):
        self.submitted.append(request)
        return "handle"


def gateway(admission, tmp_path):
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}
    return Gateway(plan, routes, "unix:/nonexistent/sink.sock", admission=admission, shm_root=tmp_path)


def test_a_retired_gateway_forwards_new_requests_to_its_successor(tmp_path):
    old, successor = gateway(Admission(), tmp_path), Successor()
    old.retire(successor)
    assert asyncio.run(old.submit({"text": "hi"})) == "handle"
    assert successor.submitted == [{"text": "hi"}]


def test_stopping_a_retired_gateway_leaves_the_shared_admission_queue_alone(tmp_path):
    admission = Admission()
    old = gateway(admission, tmp_path)
    old.retire(Successor())
    old.stop_accepting()
    slot = asyncio.run(admission.acquire())  # still admits: the successor's requests go on
    slot.release()


def test_a_gateway_that_is_not_retired_drains_admission_when_it_stops_accepting(tmp_path):
    admission = Admission()
    gateway(admission, tmp_path).stop_accepting()
    with pytest.raises(AdmissionRejected) as caught:
        asyncio.run(admission.acquire())
    assert caught.value.reason == "DRAINING"
