"""grpc_parsing.add_parsing_service: a request that does not parse is INVALID_ARGUMENT, not UNKNOWN."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
from stagevisor.supervisor.grpc_parsing import add_parsing_service


class Servicer(admin_pb2_grpc.AdminServicer):
    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def GetStatus(self, request, context):
        return admin_pb2.Status(state="SERVING")

    async def RestartGroup(self, request, context):
        return admin_pb2.RestartGroupResponse(name=request.name)

    async def WatchEvents(self, request, context):
        try:
            for group in ("a", "b"):
                yield admin_pb2.LifecycleEvent(group=group)
            await asyncio.sleep(60)  # a watch stays open until its client goes
        finally:
            self.closed.set()


def call(tmp_path, scenario):
    async def main():
        servicer = Servicer()
        server = grpc.aio.server()
        add_parsing_service(admin_pb2_grpc.add_AdminServicer_to_server, servicer, server, "admin.proto")
        address = f"unix:{tmp_path / 'admin.sock'}"
        server.add_insecure_port(address)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                return await asyncio.wait_for(scenario(channel, servicer), 30)
        finally:
            await server.stop(None)

    return asyncio.run(main())


def raw(channel, method: str, response):
    return channel.unary_unary(
        f"/stagevisor.v1.Admin/{method}",
        request_serializer=lambda data: data,
        response_deserializer=response.FromString,
    )


@pytest.mark.parametrize(
    "method, data, what",
    [
        ("GetStatus", b"\xff\xff\xff", "the request is not a stagevisor.v1.GetStatusRequest"),
        ("RestartGroup", bytes([1 << 3 | 2, 2]) + b"\xff\xfe", "UTF-8"),  # name: not UTF-8
    ],
)
def test_a_request_that_does_not_parse_is_invalid_argument_naming_the_proto(tmp_path, method, data, what):
    """It was grpc.aio's UNKNOWN "Unexpected <class 'DecodeError'>", and an ERROR traceback in the daemon's log."""
    response = admin_pb2.Status if method == "GetStatus" else admin_pb2.RestartGroupResponse

    async def scenario(channel, servicer):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw(channel, method, response)(data)
        good = await admin_pb2_grpc.AdminStub(channel).GetStatus(admin_pb2.GetStatusRequest())
        return caught.value, good

    error, good = call(tmp_path, scenario)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert what in error.details() and "admin.proto" in error.details()
    assert good.state == "SERVING"


def test_well_formed_requests_and_a_watch_are_served_as_before(tmp_path):
    async def scenario(channel, servicer):
        stub = admin_pb2_grpc.AdminStub(channel)
        restarted = await stub.RestartGroup(admin_pb2.RestartGroupRequest(name="vocoder"))
        watch = stub.WatchEvents(admin_pb2.WatchEventsRequest())
        groups = [(await watch.read()).group, (await watch.read()).group]
        watch.cancel()
        await asyncio.wait_for(servicer.closed.wait(), 10)  # the servicer's generator ends with its client
        return restarted.name, groups

    assert call(tmp_path, scenario) == ("vocoder", ["a", "b"])


def test_stubs_that_register_no_method_handlers_are_refused_not_served_empty():
    """Stubs generated before grpcio-tools 1.63 call only add_generic_rpc_handlers: the service would have no
    methods at all (every call UNIMPLEMENTED) without a word."""

    def old_stubs(servicer, server):
        server.add_generic_rpc_handlers(())

    with pytest.raises(TypeError, match="old_stubs registered no method handlers"):
        add_parsing_service(old_stubs, object(), object(), "admin.proto")  # type: ignore[arg-type]
