"""A data-plane link broken by this process's own descriptor limit is reported as that, not as a dead worker."""

import errno

import grpc

from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.link.outbound import out_of_descriptors
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.fakes import RecordedLink
from tests.unit.dataplane.client_reading import read_failure

EMFILE_DETAILS = (
    "failed to connect to all addresses; last error: INTERNAL: unix:/tmp/stagevisor-0/d1/g0.sock: "
    "socket: Too many open files"
)


def rpc_error(details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


GROUP = "unix:/nonexistent/g0.sock"


def failure_after_break(tmp_path, error: BaseException) -> str:
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: GROUP for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    handle = RequestHandle(gateway, "r1", 1)
    link = RecordedLink(GROUP)
    handle.links.add(link)
    gateway.requests["r1"] = handle
    gateway.on_link_broken(link, error)
    return str(read_failure(handle))  # the failure the broken link ended the request with, as its client reads it


def test_a_link_the_daemon_could_not_open_for_want_of_descriptors_names_the_limit_to_the_client(tmp_path):
    message = failure_after_break(tmp_path, rpc_error(EMFILE_DETAILS))
    assert "out of file descriptors" in message and "ulimit -n" in message
    assert "became unreachable" not in message


def test_a_link_to_a_worker_that_went_away_still_says_the_worker_became_unreachable(tmp_path):
    message = failure_after_break(tmp_path, rpc_error("Socket closed"))
    assert "became unreachable" in message and "descriptors" not in message


def test_descriptor_exhaustion_is_recognised_from_grpc_text_and_from_an_oserror():
    assert out_of_descriptors(rpc_error(EMFILE_DETAILS))
    assert out_of_descriptors(OSError(errno.EMFILE, "Too many open files"))
    assert not out_of_descriptors(rpc_error("Connection reset by peer"))
    assert not out_of_descriptors(ConnectionError("link ended"))
    assert not out_of_descriptors(None)


def test_a_replica_whose_link_broke_for_want_of_descriptors_stays_in_the_gateways_rotation(tmp_path):
    """The daemon's own limit, not a dead replica: it was taken out of rotation until the daemon's next replica
    announcement, which may never come."""
    plan = plan_placement(PlacementRequest("demo"))
    group, replica = "unix:/nonexistent/g0.sock", "unix:/nonexistent/g0-1.sock"
    gateway = Gateway(plan, {s.name: group for s in plan.stages}, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    gateway.router.set_ready(group, (group, replica))

    class Broken:
        address = replica

    gateway.on_link_broken(Broken(), rpc_error(EMFILE_DETAILS))
    assert gateway.router.groups[group] == (group, replica)
    gateway.on_link_broken(Broken(), rpc_error("Socket closed"))
    assert gateway.router.groups[group] == (group,)
