"""Emitter: what a stage's outputs become once it returns or streams: handoffs to the stages after it.

A chunk for a stage served here is the very object, put on that stage's
queue; one for a stage in another process is a Chunk frame, sent as the
stream's credits allow. When a stage returns, its streams end (the end marker
carries its final data where the receiver is also its `next` stage), remote
`next` stages get a Submit frame, and a terminal stage reports Done with the
request's trace to the gateway. Every handoff appends a hop to the trace, so
`edge_transports` reflects what requests really used.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Container, Mapping

from stagevisor.stages.base import StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.addressing import Addresses
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.invocation import Invocation
from stagevisor.supervisor.dataplane.request_state import RequestState
from stagevisor.supervisor.dataplane.routing import SINK, Routing
from stagevisor.supervisor.dataplane.streams import STREAM_WINDOW, ChunkQueue, CreditWindow
from stagevisor.supervisor.dataplane.trace import IN_PROCESS, Trace, ended_stages_to_timings, flatten, hop, to_timings
from stagevisor.supervisor.metrics.recorder import Recorder

_now = time.monotonic

Send = Callable[[RequestState, str, pb.Frame], Awaitable[None]]
"""Send a frame of a request to an address, with what the codec put out of line for it (StageRuntime.send)."""
Start = Callable[[RequestState, str, StagePayload, Trace, "ChunkQueue | None"], None]
"""Run a stage for a request in a task of its own (stage_calls.StageCalls.start)."""


class Emitter:
    """Hands a stage's chunks and final data on: to local stages directly, to other processes as frames."""

    def __init__(
        self,
        routing: Mapping[str, Routing],
        served: Container[str],
        codec: Codec,
        recorder: Recorder | None,
        sink_address: str,
        addresses: Addresses,
        send: Send,
        start: Start,
    ) -> None:
        self._routing = routing
        self._served = served
        self.codec = codec
        self.recorder = recorder
        self.sink_address = sink_address
        self._address = addresses.address
        self._transport = addresses.transport
        self._send = send
        self._start = start

    async def send_outputs(
        self, inv: Invocation, routing: Routing, data: dict[str, Any], ended: float, spans: bool
    ) -> None:
        """End this stage's streams, submit to remote `next` stages, report a terminal stage done.

        `ended` is when the stage returned (0: not timed); with metrics on, what goes to another
        process carries it (read now if need be) for the receiver's handoff latency. `spans`: the
        request's timings are read (metrics on), so a terminal stage sends them with Done.
        """
        if not ended and routing.remote and self.recorder is not None:
            ended = _now()
        for dst, with_data in routing.ends:
            await self._end_stream(inv, dst, data if with_data else None, ended, spans)
        for dst in routing.remote_next:
            await self._submit_remote(inv, dst, data, ended)
        if routing.terminal:
            # Ended as a stream is (`_end_stream`): a chunk after Done would reach the client no more.
            state = inv.state
            window = state.outbound.pop((inv.stage, SINK), None)
            if isinstance(window, CreditWindow):
                window.close()  # a send of a task left running, waiting for credit, is told rather than left waiting
            if state.ended is None:
                state.ended = set()
            state.ended.add((inv.stage, SINK))
            frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=SINK)
            frame.done.SetInParent()
            frame.done.trace.extend(flatten(inv.trace))  # in place: Frame(done=Done(...)) copies the message
            if spans:
                to_timings(inv.trace, frame.done.timings)  # only for requests whose timings someone reads
            await self._send(inv.state, self.sink_address, frame)

    def _encode(self, obj: Any, value: pb.Value, peer: str | None = None) -> None:
        try:
            self.codec.encode_into(obj, value, peer)
        except BaseException:
            self.codec.drop(self.codec.take_out_of_line().segments)  # written for a frame never sent
            raise

    async def _submit_remote(self, inv: Invocation, dst: str, data: dict[str, Any], ended: float) -> None:
        frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=dst)
        address = self._address(inv.state, dst)
        self._encode(inv.payload.request, frame.submit.request, address)
        self._encode(data, frame.submit.data, address)
        trace = (inv.trace, hop(inv.stage, dst, self._transport(address)))
        frame.submit.trace.extend(flatten(trace))
        if self.recorder is not None:
            if inv.payload.request.get("timings") is True:
                to_timings(trace, frame.submit.timings)
            else:  # just when this stage returned, for the receiver's handoff latency
                to_timings(((None, [inv.stage, ended, ended]), trace[1]), frame.submit.timings)
        await self._send(inv.state, address, frame)

    def _open_local_stream(self, inv: Invocation, dst: str) -> ChunkQueue:
        queue = ChunkQueue(STREAM_WINDOW)
        inv.state.inbound[(inv.stage, dst)] = queue
        payload = StagePayload(inv.request_id, inv.payload.request, {})
        inv.state.stream_payloads[(inv.stage, dst)] = payload
        in_process_hop = hop(inv.stage, dst, IN_PROCESS)
        trace: Any = (inv.trace, in_process_hop)
        if self.recorder is not None:
            trace = (trace, [in_process_hop, _now(), 0.0])
            queue.edge = self.recorder.edge(inv.stage, dst, IN_PROCESS)  # looked up once per stream, not per chunk
        self._start(inv.state, dst, payload, trace, queue)
        return queue

    def _opening(self, inv: Invocation, dst: str, opening: pb.Opening) -> None:
        address = self._address(inv.state, dst)
        self._encode(inv.payload.request, opening.request, address)
        grpc_hop = hop(inv.stage, dst, self._transport(address))
        trace = (inv.trace, grpc_hop)
        opening.trace.extend(flatten(trace))
        if self.recorder is not None:
            to_timings((trace, [grpc_hop, _now(), 0.0]), opening.timings)

    async def stream_chunk(self, inv: Invocation, chunk: Any) -> None:
        """Hand one chunk to every `stream_to` stage of the invocation's stage (the client for a terminal one)."""
        state = inv.state
        for dst in self._routing[inv.stage].stream_targets:
            out = state.outbound.get((inv.stage, dst))
            if out is None:
                if state.ended is not None and (inv.stage, dst) in state.ended:
                    # A task the stage left running: the stream would open again and start its receiver twice, or
                    # its chunk would follow the request's Done to the gateway, which drops it.
                    raise _streamed_after_return(inv)
                if dst in self._served:
                    out = self._open_local_stream(inv, dst)
                else:
                    out = CreditWindow()
                state.outbound[(inv.stage, dst)] = out
            if isinstance(out, ChunkQueue):
                await out.put(chunk)  # the same object, handed over; waits while the queue is full
                if out.edge is not None:
                    out.edge.chunks += 1
                continue
            await out.acquire()
            if state.cancelled or state.failed:
                raise asyncio.CancelledError()
            if out.closed:  # the stream ended while this send of a task left running waited for credit
                raise _streamed_after_return(inv)
            frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=dst)
            address = self.sink_address if dst == SINK else self._address(state, dst)
            self._encode(chunk, frame.chunk.value, address)
            if not out.opened and dst != SINK:
                self._opening(inv, dst, frame.chunk.opening)
            out.opened = True
            await self._send(state, address, frame)

    async def _end_stream(
        self, inv: Invocation, dst: str, data: dict[str, Any] | None, ended: float, spans: bool
    ) -> None:
        state = inv.state
        out = state.outbound.pop((inv.stage, dst), None)
        if isinstance(out, CreditWindow):
            out.close()  # a send of a task left running, waiting for credit, is told rather than left waiting
        if state.ended is None:
            state.ended = set()
        state.ended.add((inv.stage, dst))
        if dst in self._served:
            queue = out if out is not None else self._open_local_stream(inv, dst)
            target = state.stream_payload(inv.stage, dst)
            if data is not None and target is not None:
                target.data.update(data)
            queue.end()
            return
        frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=dst)
        end = frame.end
        end.has_data = data is not None
        address = self._address(state, dst)
        self._encode(data, end.data, address)
        end.src_end = ended
        if spans:  # stages running in this process when the stream opened may have returned since
            ended_stages_to_timings(inv.trace, end.timings)
        if out is None or not out.opened:
            self._opening(inv, dst, end.opening)
        await self._send(state, address, frame)


def _streamed_after_return(inv: Invocation) -> RuntimeError:
    return RuntimeError(
        f"stage {inv.stage!r} streamed a chunk of request {inv.request_id} after its process() returned; "
        "ctx.stream() is valid only while process() runs (stages/base.py)"
    )
