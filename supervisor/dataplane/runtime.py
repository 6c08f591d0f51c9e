"""StageRuntime: runs a worker's stages per request and routes their results along the pipeline's edges.

This module wires the parts together and owns what they share: the worker's
outbound links, failing a request (a Failure frame to the gateway, then its
cancellation) and the daemon's word on replicas. The parts, one concept each:

- routing.py: where each stage's outputs go, worked out once (RoutingTable);
- request_state.py: what the worker holds per request, bounded (RequestTable);
- addressing.py: which worker or pinned replica a request's frames go to;
- invocation.py: the StageContext a stage gets (Invocation);
- stage_calls.py: a stage call and its chain of direct in-process calls (StageCalls);
- emit.py: what a stage's chunks and final data become (Emitter);
- receive.py: the frames peers send, checked and dispatched (FrameReceiver).

In-process edges are direct calls: the receiving stage gets the very objects
the sender returned; nothing is encoded or copied. Cross-process edges become
frames on a link to the worker that serves the receiving stage. Every handoff
appends a hop to the request's trace, which terminal stages report to the
gateway, so `edge_transports` reflects what requests really used.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from stagevisor.stages.base import Stage, StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.addressing import Addresses
from stagevisor.supervisor.dataplane.client_failures import worker_stopped, worker_unreachable
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.emit import Emitter
from stagevisor.supervisor.dataplane.link.outbound import FrameTooLarge, LinkPool, OutboundLink, out_of_descriptors
from stagevisor.supervisor.dataplane.link.frames import BadFrame
from stagevisor.supervisor.dataplane.link.server import InboundLink
from stagevisor.supervisor.dataplane.peers import PeerDirectory
from stagevisor.supervisor.dataplane.receive import FrameReceiver
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.request_state import (
    MAX_REQUESTS,
    STREAM_IDLE_TIMEOUT,
    RequestState,
    RequestTable,
)
from stagevisor.supervisor.dataplane.routing import SINK, RoutingTable
from stagevisor.supervisor.dataplane.stage_calls import StageCalls
from stagevisor.supervisor.dataplane.streams import ChunkQueue
from stagevisor.supervisor.dataplane.trace import Trace
from stagevisor.supervisor.metrics.recorder import Recorder
from stagevisor.supervisor.plan import PlannedStage

__all__ = ["StageRuntime"]


class StageRuntime:
    """Per-request invocation of one worker's stages, and the routing of what they produce."""

    def __init__(
        self,
        stages: Mapping[str, PlannedStage],
        executors: Mapping[str, Stage],
        routes: Mapping[str, str],
        sink_address: str,
        peer_name: str,
        codec: Codec,
        recorder: Recorder | None = None,
        *,
        max_requests: int = MAX_REQUESTS,
        stream_idle_timeout: float = STREAM_IDLE_TIMEOUT,
        replicas: Mapping[str, tuple[str, ...]] | None = None,
        directory: PeerDirectory | None = None,
    ) -> None:
        self.stages = dict(stages)
        self.executors = dict(executors)
        self.sink_address = sink_address
        self.codec = codec
        self.recorder = recorder
        self.peer_name = peer_name
        self.directory = directory if directory else None
        """Where peers run under --launcher ray (peers.py): other nodes over TCP, no shared memory to them."""
        if self.directory is not None:
            codec.remote = self.directory.remote
        self.router = ReplicaRouter(replicas)
        """Replicated groups' READY replicas (group address -> replica addresses), pushed by the daemon."""
        self.addresses = Addresses(routes, self.router, self.directory)
        self.routes = self.addresses.routes
        self.requests = RequestTable(
            peer_name,
            self.executors,
            self.addresses.release,
            self._refuse,
            self.fail,
            max_requests=max_requests,
            stream_idle_timeout=stream_idle_timeout,
            keep_alive=self._keep_alive,
        )
        self.routing = RoutingTable(self.stages, self.executors, recorder)
        self.emitter = Emitter(
            self.routing.by_stage,
            self.executors,
            codec,
            recorder,
            sink_address,
            self.addresses,
            self.send,
            self._start,
        )
        self.calls = StageCalls(
            self.routing.plan,
            self.routing.in_process_edges,
            recorder,
            self.emitter,
            self.emitter.send_outputs,
            self.fail,
            self.requests.task_done,
        )
        if recorder is not None:
            recorder.bind_chains(self.routing.chains(), self.calls.running_calls)
        self.receiver = FrameReceiver(
            peer_name, self.executors, codec, recorder, self.directory, self.requests, self.calls, self
        )
        # The receiver's entry points, as attributes: a link calls them per frame with no call in between.
        self.on_frame: Callable[[pb.Frame, InboundLink], None] = self.receiver.on_frame
        """A frame from a peer's link to this worker; a bad one fails only its own request."""
        self.on_bad_frame: Callable[[BadFrame, InboundLink], None] = self.receiver.on_bad_frame
        """A frame that did not parse, or a piece that did not fit: fail its request, if it can be told."""
        self.on_reply: Callable[[pb.Frame], None] = self.receiver.on_reply
        """A frame answered on one of this worker's outbound links: stream credits (links take releases)."""
        self.links = LinkPool(peer_name, self.on_reply, self.on_link_broken, buffers=codec, directory=self.directory)
        self.inbound_links: set[InboundLink] = set()
        """The links dialled to this worker, open now (the gateway's and other workers'): its last word as it stops
        goes on each (`leave`)."""
        self._leaving: pb.Frame | None = None
        """That last word, once said: a link dialled after it hears it at once."""
        self.name = peer_name
        """The name the daemon runs this worker under now: `peer_name` (the one it started with, which it answers
        frames with) until a scale between one replica and more renames it (Replicas.names)."""
        self.on_renamed: Callable[[str], None] | None = None
        """Called with the new `name` when the daemon renames this worker (the worker's process title and logs)."""

    def on_hello(self, link: InboundLink) -> None:
        """Who dialled an inbound link: kept for `leave` (told at once when this worker has left)."""
        self.inbound_links.add(link)
        if self._leaving is not None:
            link.reply(self._leaving)

    def on_inbound_closed(self, link: InboundLink) -> None:
        self.inbound_links.discard(link)

    # ---- bookkeeping ------------------------------------------------------------

    @property
    def max_requests(self) -> int:
        """Requests this worker holds state for at once (RequestTable)."""
        return self.requests.max_requests

    @max_requests.setter
    def max_requests(self, value: int) -> None:
        self.requests.max_requests = value

    @property
    def stream_idle_timeout(self) -> float:
        """Seconds a stage may wait on a silent inbound stream before its request fails (RequestTable)."""
        return self.requests.stream_idle_timeout

    @stream_idle_timeout.setter
    def stream_idle_timeout(self, value: float) -> None:
        self.requests.stream_idle_timeout = value

    def in_flight(self) -> int:
        return len(self.requests)

    def _start(
        self, state: RequestState, stage: str, payload: StagePayload, trace: Trace, inbound: ChunkQueue | None = None
    ) -> None:
        # The emitter's way to start a stream's receiver: StageCalls is built after the emitter it calls.
        self.calls.start(state, stage, payload, trace, inbound)

    # ---- failing requests, sending frames ---------------------------------------

    def fail(
        self,
        state: RequestState,
        stage: str,
        code: pb.FailureCode,
        message: str,
        client_message: str = "",
        error_type: str = "",
        client_code: str = "",
        client_field: str = "",
    ) -> None:
        """Fail the request at the gateway: `message` for the daemon log, `client_message` (if any) for the client.

        `error_type` is an unexpected exception's class, the one thing of it the client learns; `client_code` a
        StageError's own code, `client_field` the request field it names."""
        if state.failed or state.cancelled:
            return
        state.failed = True
        self.links.send(
            self.sink_address,
            pb.Frame(
                request_id=state.request_id,
                src=stage,
                dst=SINK,
                failure=pb.Failure(
                    stage=stage,
                    code=code,
                    message=message,
                    client_message=client_message,
                    error_type=error_type,
                    client_code=client_code,
                    client_field=client_field,
                ),
            ),
        )
        self.cancel(state.request_id, current=asyncio.current_task())

    def _keep_alive(self, request_ids: list[str]) -> None:
        """Tell the gateway this worker still holds these requests (a stage runs each, or it waits for a turn or a
        stream), so that its --pipeline-idle-timeout fails only requests no worker holds."""
        for request_id in request_ids:
            self.links.send(self.sink_address, pb.Frame(request_id=request_id, dst=SINK, keepalive=pb.KeepAlive()))

    def reject(self, request_id: str, stage: str, code: pb.FailureCode, message: str) -> None:
        """Fail a request because of a frame, whether or not this worker holds state for it."""
        state = self.requests.get(request_id)
        if state is not None:
            self.fail(state, stage, code, message)
            return
        if self.requests.recently_cancelled(request_id):
            return
        self.requests.remember_cancelled(request_id)  # its later frames are dropped quietly
        self.links.send(
            self.sink_address,
            pb.Frame(
                request_id=request_id, src=stage, dst=SINK, failure=pb.Failure(stage=stage, code=code, message=message)
            ),
        )

    def _refuse(self, request_id: str, message: str) -> None:
        """The request table will not hold this request (full, or its peer's share is taken)."""
        self.reject(request_id, "", pb.FAILURE_CODE_UNAVAILABLE, message)

    async def send(self, state: RequestState, address: str, frame: pb.Frame) -> None:
        """Send a frame of a request to `address`, with what the codec put out of line for it."""
        # Taken before the first await: what the codec put out of line belongs to this frame.
        out = self.codec.take_out_of_line()
        try:
            link = self.links.get(address)
        except BaseException:
            self.codec.drop(out.segments)
            raise
        state.links.add(link)
        try:
            await link.send_async(frame, out)
        except FrameTooLarge:
            self.codec.drop(out.segments)  # refused before the link held them
            raise
        if out.segments:
            await asyncio.sleep(0)  # let the link reader take in released buffers, so the pool reuses them

    # ---- replicas and peers -----------------------------------------------------

    def apply_replicas(self, message: pb.Replicas) -> None:
        """The daemon's word on replicas: which take new requests, which died (their requests fail now)."""
        for entry in message.sets:
            if entry.address not in self.router.groups:
                self.addresses.pin_in_flight(entry.address, self.requests.states())
            self.router.set_ready(entry.address, entry.ready)
        for replica in message.lost:
            self.replica_lost(replica)
        name = message.names.get(self.peer_name, "")
        if name and name != self.name:
            self.name = name
            if self.on_renamed is not None:
                self.on_renamed(name)

    def replica_lost(self, replica: str) -> None:
        """Fail the requests this worker routed to a replica that died, held here or already handed on."""
        self.router.mark_down(replica)
        message = (
            f"the worker serving stage {', '.join(map(repr, self.addresses.stages_at(replica)))} "
            f"(replica at {replica.rpartition('/')[2]}) went down; retry"
        )
        for state in self.requests.states():
            if state.replicas and replica in state.replicas.values():
                self.fail(state, "", pb.FAILURE_CODE_UNAVAILABLE, message)
        self._fail_handed_on(replica, message)

    def _fail_handed_on(self, address: str, message: str, *, fallbacks_only: bool = False) -> None:
        """Fail the requests this worker recently routed to `address` (a replica, or a replicated group's own
        address) and no longer holds: no one else may be watching them there (the gateway watches a
        replicated group's requests through their senders). `fallbacks_only`: only those routed to a group's own
        address for want of a replica taking requests."""
        for request_id in self.router.routed_to(address, fallbacks_only=fallbacks_only):
            if self.requests.get(request_id) is None:
                self.reject(request_id, "", pb.FAILURE_CODE_UNAVAILABLE, message)
        self.router.forget(address, fallbacks_only=fallbacks_only)

    def on_link_broken(self, link: OutboundLink, error: BaseException) -> None:
        """Fail every request that sent frames on a link that broke (its peer went away), and those this worker
        routed there (to a replica, or to a replicated group's address) and has handed on all of."""
        stages = self.addresses.stages_at(link.address)
        if out_of_descriptors(error):  # this worker could not open a socket: the peer is fine
            message = (
                f"worker {self.peer_name!r} is out of file descriptors and could not reach stage "
                f"{', '.join(map(repr, stages))}; retry later, and have the operator raise its limit (ulimit -n)"
            )
        else:
            message = worker_unreachable(stages, (), out_of_descriptors=False)  # as the gateway says it
        for state in self.requests.states():
            if link in state.links:
                self.fail(state, "", pb.FAILURE_CODE_UNAVAILABLE, message)
        if self.router.group_of(link.address) is None or out_of_descriptors(error):
            return  # for want of descriptors here: the replica and what it holds are fine
        if link.address in self.router.retired:
            # Stopped on purpose (a scale-down, a restart): it answered or failed all it held itself, and a failure
            # from here could reach the gateway before that worker's last answer. Only what went there for want
            # of a replica taking requests was never taken by anyone. The rest is remembered: should the worker
            # have died while it drained, the daemon says it is lost (`replica_lost`), and that fails here.
            self._fail_handed_on(link.address, message, fallbacks_only=True)
            return
        # Its peer is gone: new requests avoid it until the daemon announces it again, and what this worker handed
        # on there fails.
        self.router.mark_down(link.address)
        self._fail_handed_on(link.address, message)

    # ---- cancellation and shutdown ----------------------------------------------

    def cancel(self, request_id: str, current: asyncio.Task[Any] | None = None) -> None:
        """Stop all work of a request in this worker and drop its buffered chunks."""
        self.requests.cancel(request_id, current)

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` seconds for in-flight requests, then fail at the gateway what is left, and refuse
        what arrives from then on: a request this worker drops unanswered would wait on its client's deadline
        wherever no one else watches this worker for it (a group routed as replicated is watched by its senders,
        and a sender forgets a request once it has handed on all of it). Then tell the gateway where it routed
        requests among replicas (`hand_over_routes`), and last, on every link dialled to it, which requests no
        longer depend on this worker (`leave`).

        Requests whose first frame arrives during the drain are waited for too
        (a sender may have routed one to this replica just before it left the rotation).
        """
        await self.requests.drain(grace)
        message = worker_stopped(sorted(self.executors))
        self.requests.close_to_new(message)
        failed = [state.request_id for state in self.requests.states()]
        await self.requests.fail_all(pb.FAILURE_CODE_UNAVAILABLE, message)
        self.hand_over_routes()
        await self.leave(failed, message)

    async def leave(self, failed: list[str], message: str) -> None:
        """Tell every peer linked to this worker that it stops: the requests whose work here ended, which may go on
        in later stages' workers (its link breaking must not fail them at the gateway), and those it failed with
        `message`, which the gateway fails at once in those words. Waits (up to a second) until it is written, so
        each peer reads it before it sees the link break. A peer then sends nothing more on its link and ends it
        once what it queued before is written (`settle` waits for that)."""
        leaving = self._leaving = pb.Frame(
            leaving=pb.Leaving(finished=self.requests.finished(), failed=failed, message=message)
        )
        links = list(self.inbound_links)
        for link in links:
            link.reply(leaving)
        await asyncio.gather(*(link.flush(1.0) for link in links))

    async def settle(self, timeout: float) -> bool:
        """After `leave`: wait up to `timeout` seconds until every link dialled to this worker has ended, so the
        frames peers sent before they read it are read here (a request one would open is refused at the gateway,
        `RequestTable.close_to_new`) before the server stops and drops what is unread. False if some had not."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.inbound_links:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def hand_over_routes(self) -> None:
        """Tell the gateway where this worker routed requests among replicas (after the failures of those it held,
        on the same link): once it is gone no sender knows that a request it handed on is there, and the gateway
        fails those still in flight should that replica be lost, instead of at its idle timeout."""
        for replica, request_ids in self.router.picks_by_replica().items():
            self.links.send(
                self.sink_address, pb.Frame(handed_on=pb.HandedOn(replica=replica, request_ids=request_ids))
            )

    def expire_idle(self, now: float) -> int:
        """Fail requests whose stage waits on a stream silent for stream_idle_timeout; return how many."""
        return self.requests.expire_idle(now)

    async def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) until what was queued on every live link is written: the last chunks and
        completions of a draining worker reach their receivers before it exits."""
        await self.links.flush(timeout)

    async def close(self) -> None:
        self.requests.close()
        await self.links.close()
        self.codec.close()
