"""A worker's StageRuntime driven without processes or sockets: stages planned in one group, links that record what
it sends (tests/fakes.py), and frames submitted to it as the gateway sends them."""

from __future__ import annotations

from typing import Any, Iterable

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.plan import PlannedStage
from tests.fakes import FakeInboundLink, RecordedLinks

SINK = "unix:/nonexistent/sink.sock"
"""The gateway's sink address the runtime reports to (its frames are in `runtime.links.sent[SINK]`)."""

inbound_link = FakeInboundLink()
"""The link `submit` hands frames in on."""


def planned(name: str, next: Iterable[str] = (), stream_to: Iterable[str] = ()) -> PlannedStage:
    """A CPU stage of group "p" with these outgoing edges."""
    return PlannedStage(
        name=name,
        process="p",
        gpu=None,
        tp_size=1,
        total_gpu_memory_fraction=None,
        fraction_source=None,
        factory=None,
        next=tuple(next),
        stream_to=tuple(stream_to),
    )


def make_runtime(
    stages: Iterable[PlannedStage], executors: dict[str, Any], routes: dict[str, str] | None = None
) -> StageRuntime:
    """A runtime for these stages whose links record every frame (RecordedLinks)."""
    runtime = StageRuntime({s.name: s for s in stages}, executors, routes or {}, SINK, "test", Codec())
    runtime.links = RecordedLinks()
    return runtime


def submit(
    runtime: StageRuntime,
    stage: str,
    request_id: str = "r1",
    request: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Hand the runtime a request for `stage`, as the gateway's submit frame."""
    frame = pb.Frame(request_id=request_id, src="", dst=stage)
    runtime.codec.encode_into(request or {"text": "hi", "options": {}}, frame.submit.request)
    runtime.codec.encode_into(data or {}, frame.submit.data)
    runtime.on_frame(frame, inbound_link)


class Record:
    """A stage that keeps every payload it is given and returns `result`."""

    def __init__(self, result: Any = None) -> None:
        self.payloads: list[Any] = []
        self.result = result

    async def process(self, payload: Any, ctx: Any) -> Any:
        self.payloads.append(payload)
        return self.result


async def handed_on_to_a_replica():
    """A worker whose stage `a` streams to `b`, a group of two (its own address and a replica): request r1 went to
    the replica, all of it, and the worker holds it no more. Returns (runtime, group address, replica address)."""
    from tests.fakes import poll_until

    class Streams:
        async def process(self, payload, ctx):
            await ctx.stream({"i": 0})
            return {}

    group, replica = "unix:/b.sock", "unix:/b1.sock"
    runtime = make_runtime([planned("a", next=["b"], stream_to=["b"])], {"a": Streams()}, routes={"b": group})
    runtime.router.set_ready(group, (group, replica))
    runtime.router.in_flight[group] = 1  # the group's own worker is busier: the request goes to the replica
    submit(runtime, "a", request_id="r1")
    assert await poll_until(lambda: runtime.links.bodies(replica) == ["chunk", "end"] and runtime.in_flight() == 0)
    return runtime, group, replica
