"""StageRuntime: runs a worker's stages per request and routes their results along the pipeline's edges.

In-process edges are direct calls: the receiving stage gets the very objects
the sender returned (the `data` dict itself for a `next` edge, each chunk
object for a `stream_to` edge); nothing is encoded or copied. Cross-process
edges become frames on a link to the worker that serves the receiving stage.
Every handoff appends a hop to the request's trace, which terminal stages
report to the gateway, so `edge_transports` reflects what requests really used.
With a Recorder (metrics on), a direct call costs nothing extra: the Recorder
derives the calls and handoffs of direct calls when it reports, from one count
per chain of calls and the chains live at that moment; it times the stage calls
of the chains it picks, and of requests whose timings someone reads, whose
process() calls are also Spans in the trace (see supervisor/metrics/recorder.py).

What peers send is checked, not trusted: a frame that does not parse or
decode, or names a stage this worker does not serve, fails only its own
request (a Failure to the sink). State is bounded: at most `max_requests`
requests are held at once, and a request whose stage waits on a stream that
has been silent for `stream_idle_timeout` seconds (its sender is gone, or it
never existed) is failed and forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, AsyncIterator, Mapping

from stagevisor.stages.base import InvalidRequest, Stage, StageError, StagePayload
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec, discard_shared, inline_bytes_received, shared_bytes_received
from stagevisor.supervisor.dataplane.limits import per_peer_cap
from stagevisor.supervisor.dataplane.link import BadFrame, InboundLink, LinkPool, OutboundLink, bad_frames_log
from stagevisor.supervisor.dataplane.peers import PeerDirectory
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.trace import (
    GRPC,
    GRPC_TCP,
    IN_PROCESS,
    Run,
    Span,
    Trace,
    flatten,
    from_hops,
    from_timings,
    hop,
    runs,
    sent_at,
    to_timings,
)
from stagevisor.supervisor.dataplane.streams import STREAM_WINDOW, ChunkQueue, CreditWindow, empty_chunks
from stagevisor.supervisor.metrics.recorder import SHARED_MEMORY, EdgeStats, Recorder, StageStats
from stagevisor.supervisor.plan import PlannedStage

log = logging.getLogger(__name__)

SINK = ""
"""The `dst` of frames meant for the gateway, i.e. the client."""
_RECENT_CANCELS = 4096
_now = time.monotonic


def _received() -> tuple[int, int]:
    """(bytes mapped from shared memory, bytes taken from inline pieces) by this process so far."""
    return shared_bytes_received(), inline_bytes_received()


MAX_REQUESTS = 4096
"""Requests one worker holds state for at once; frames of further requests are refused."""
STREAM_IDLE_TIMEOUT = 300.0
"""Seconds a stage may wait on an inbound stream that receives nothing before its request fails."""


@dataclass
class _Routing:
    """Where one local stage's outputs go, worked out once instead of per request."""

    stream_targets: tuple[str, ...]
    """stream_to stages, or the sink for a terminal stage."""
    ends: tuple[tuple[str, bool], ...]
    """(stream_to stage, whether its end marker carries the final data because it is also `next`)."""
    local_next: tuple[tuple[str, str], ...]
    """(stage, its in-process hop string) for each local `next` stage."""
    remote_next: tuple[str, ...]
    terminal: bool
    stats: StageStats | None = None
    """This stage's stats when metrics are on."""
    # Derived once for the in-process hot path in StageRuntime._run.
    sends: bool = field(init=False)
    remote: bool = field(init=False)
    """Whether this stage ends streams or submits to another process (its end time may ride with them)."""
    local_tasks: tuple[tuple[str, str], ...] = field(init=False)
    local_direct: tuple[str, str] | None = field(init=False)
    runs: tuple[Run, ...] = ()
    """The trace runs of the chain of direct calls from this stage (trace.runs), set by StageRuntime."""
    direct: tuple[str, Any, "_Routing"] | None = None
    """The direct call's stage (from local_direct, so served here), its executor and routing; set by StageRuntime."""

    def __post_init__(self) -> None:
        self.sends = bool(self.ends or self.remote_next or self.terminal)
        self.remote = bool(self.remote_next or self.ends)
        self.local_tasks = self.local_next[:-1]
        self.local_direct = self.local_next[-1] if self.local_next else None


@dataclass
class _RequestState:
    """What one worker holds for one in-flight request."""

    request_id: str
    tasks: set[asyncio.Task] = field(default_factory=set)
    inbound: dict[tuple[str, str], ChunkQueue] = field(default_factory=dict)
    stream_payloads: dict[tuple[str, str], StagePayload] = field(default_factory=dict)
    """The payload of the stage reading each inbound stream; the end marker fills its data."""
    outbound: dict[tuple[str, str], Any] = field(default_factory=dict)
    links: set[OutboundLink] = field(default_factory=set)
    """Links this request sent frames on: if one breaks, the request cannot finish."""
    stream_sources: dict[tuple[str, str], Span] | None = None
    """The sending stage's Span of each inbound remote stream; its end marker closes it (metrics on)."""
    cancelled: bool = False
    failed: bool = False
    touched: float = field(default_factory=time.monotonic)
    """When a frame of this request last arrived (for expiring streams that went silent)."""
    remote_streams: set[tuple[str, str]] = field(default_factory=set)
    """Inbound streams opened by a frame from another process, whatever stage the frame names as src."""
    replicas: dict[str, str] | None = None
    """Replicated group address -> the replica this request's frames for that group go to."""
    origin: InboundLink | None = None
    """The inbound link whose frame opened this request here (None: opened locally); per-peer limits count it."""


class _NoExecutor:
    """Stands in for a stage this worker does not run: calling it fails the request, so _run needs no check."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    async def process(self, payload: StagePayload, ctx: Any) -> None:
        raise LookupError(f"stage {self.stage!r} has no executor in this worker")


class Invocation:
    """The StageContext of one stage working on one request."""

    __slots__ = ("_runtime", "_state", "stage", "payload", "_base", "_direct", "inbound")

    def __init__(
        self,
        runtime: "StageRuntime",
        state: _RequestState,
        stage: str,
        payload: StagePayload,
        trace: Trace,
        inbound: ChunkQueue | None = None,
    ) -> None:
        self._runtime = runtime
        self._state = state
        self.stage = stage
        self.payload = payload
        self._base = trace
        self._direct: Run | None = None
        self.inbound = inbound

    @property
    def trace(self) -> Trace:
        """The request's trace up to this stage: `_base`, then the direct hops' Run, if any (see StageRuntime._run)."""
        run = self._direct
        return self._base if run is None else (self._base, run)

    @trace.setter
    def trace(self, trace: Trace) -> None:
        self._base, self._direct = trace, None

    @property
    def request_id(self) -> str:
        return self._state.request_id

    @property
    def cancelled(self) -> bool:
        return self._state.cancelled or self._state.failed

    async def stream(self, chunk: Any) -> None:
        await self._runtime.stream_chunk(self, chunk)

    def chunks(self) -> AsyncIterator[Any]:
        return self.inbound.__aiter__() if self.inbound is not None else empty_chunks()


def _cancelled_from_outside() -> bool:
    """Whether the running task was asked to stop (a CANCEL frame, shutdown), as opposed to code in it
    raising CancelledError of its own; where Python (3.10) cannot tell, assume it was asked."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


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
        self.routes = dict(routes)
        self.sink_address = sink_address
        self.codec = codec
        self.recorder = recorder
        self.peer_name = peer_name
        self.max_requests = max_requests
        self.stream_idle_timeout = stream_idle_timeout
        self.directory = directory if directory else None
        """Where peers run under --launcher ray (peers.py): other nodes over TCP, no shared memory to them."""
        if self.directory is not None:
            codec.remote = self.directory.remote
        self.links = LinkPool(peer_name, self.on_reply, self.on_link_broken, buffers=codec, directory=self.directory)
        self.router = ReplicaRouter(replicas)
        """Replicated groups' READY replicas (group address -> replica addresses), pushed by the daemon."""
        self._janitor: asyncio.Task | None = None
        self._routing = {name: self._routing_of(spec) for name, spec in self.stages.items()}
        for routing in self._routing.values():
            routing.runs = runs(self._direct_hops(routing))
            if routing.local_direct is not None:
                dst = routing.local_direct[0]
                routing.direct = (dst, self.executors[dst], self._routing[dst])
        self._in_process_edges: dict[str, EdgeStats] = {}
        """In-process hop string -> its stats, for handoffs that start a new task (metrics on)."""
        self._live: set[Invocation] = set()
        """Invocations inside _run now (metrics on): a report counts their current stages as running."""
        if recorder is not None:
            for name, routing in self._routing.items():
                routing.stats = recorder.stage(name)
                for dst, in_process_hop in routing.local_tasks:
                    self._in_process_edges[in_process_hop] = recorder.edge(name, dst, IN_PROCESS)
                for dst, _ in routing.ends:
                    if dst in self.executors:
                        self._in_process_edges[hop(name, dst, IN_PROCESS)] = recorder.edge(name, dst, IN_PROCESS)
            recorder.bind_chains(
                {name: r.local_direct[0] for name, r in self._routing.items() if r.local_direct}, self._running_calls
            )
        self._plan = {
            name: (self.executors[name] if name in self.executors else _NoExecutor(name), routing)
            for name, routing in self._routing.items()
        }
        self._requests: dict[str, _RequestState] = {}
        self._recent_cancels: OrderedDict[str, None] = OrderedDict()

    def _routing_of(self, spec: PlannedStage) -> _Routing:
        plain_next = [d for d in spec.next if d not in spec.stream_to]
        return _Routing(
            stream_targets=tuple(spec.stream_to) or (() if spec.next else (SINK,)),
            ends=tuple((d, d in spec.next) for d in spec.stream_to),
            local_next=tuple((d, hop(spec.name, d, IN_PROCESS)) for d in plain_next if d in self.executors),
            remote_next=tuple(d for d in plain_next if d not in self.executors),
            terminal=not spec.next,
        )

    def _direct_hops(self, routing: _Routing) -> tuple[str, ...]:
        """The hops of the chain of direct calls that starts at a stage (the pipeline is acyclic)."""
        hops = []
        while routing.local_direct is not None:
            dst, in_process_hop = routing.local_direct
            hops.append(in_process_hop)
            routing = self._routing[dst]
        return tuple(hops)

    # ---- bookkeeping ------------------------------------------------------------

    def in_flight(self) -> int:
        return len(self._requests)

    def _state(self, request_id: str, origin: InboundLink | None = None) -> _RequestState | None:
        """The request's state, created on its first frame; None for a cancelled one, or when full.

        A request opened by a frame of inbound link `origin` counts against that link's share of the
        table (limits.per_peer_cap): one peer cannot take the places the others need.
        """
        if request_id in self._recent_cancels:
            return None
        state = self._requests.get(request_id)
        if state is None:
            if len(self._requests) >= self.max_requests:
                self._reject(
                    request_id,
                    "",
                    pb.FAILURE_CODE_UNAVAILABLE,
                    f"worker {self.peer_name!r} already holds {self.max_requests} requests; "
                    "lower the admission limit or add replicas",
                )
                return None
            cap = per_peer_cap(self.max_requests)
            # Counting is needed only once the table holds more than one peer's share.
            if origin is not None and len(self._requests) >= cap and self._held_by(origin) >= cap:
                self._reject(
                    request_id,
                    "",
                    pb.FAILURE_CODE_UNAVAILABLE,
                    f"the peer {origin.peer or 'on this link'} already holds {cap} of worker "
                    f"{self.peer_name!r}'s {self.max_requests} request places (one peer's share); retry later",
                )
                return None
            state = self._requests[request_id] = _RequestState(request_id, origin=origin)
            self._watch_idle()
        return state

    def _held_by(self, origin: InboundLink) -> int:
        return sum(1 for state in self._requests.values() if state.origin is origin)

    def _start(
        self, state: _RequestState, stage: str, payload: StagePayload, trace: Trace, inbound: ChunkQueue | None = None
    ) -> None:
        self._start_invocation(Invocation(self, state, stage, payload, trace, inbound))

    def _start_invocation(self, inv: Invocation) -> None:
        state = inv._state
        task = asyncio.get_running_loop().create_task(self._run(inv), name=f"{inv.stage}:{state.request_id}")
        state.tasks.add(task)
        inbound = inv.inbound  # read now: the invocation is reused for later local stages
        task.add_done_callback(lambda t: self._task_done(state, t, inbound))

    def _task_done(self, state: _RequestState, task: asyncio.Task, inbound: ChunkQueue | None) -> None:
        state.tasks.discard(task)
        if inbound is not None and not inbound.ended:
            inbound.abandon()
        if not state.tasks and self._requests.get(state.request_id) is state:
            del self._requests[state.request_id]
            if state.replicas:
                self._release_replicas(state)

    def _release_replicas(self, state: _RequestState) -> None:
        for replica in (state.replicas or {}).values():
            self.router.release(replica)
        state.replicas = None

    def _address(self, state: _RequestState, dst: str) -> str:
        """Where frames of this request for stage `dst` go: its worker, or the replica chosen for its group."""
        address = self.routes[dst]
        groups = self.router.groups
        if not groups or address not in groups:  # no replicas: as before, one dict lookup more
            return address
        router = self.router
        chosen = state.replicas.get(address) if state.replicas is not None else None
        if chosen is None:
            chosen = router.choose(address, state.request_id)
            if state.replicas is None:
                state.replicas = {}
            state.replicas[address] = chosen
        return chosen

    # ---- running a stage --------------------------------------------------------

    async def _run(self, inv: Invocation) -> None:
        """Run a stage for one request, route its outputs, then run the local `next` stage, if any.

        A loop rather than a call per stage: a local `next` stage runs in this
        very task as a plain awaited call, with no task or coroutine created
        for the handoff (the hot path of in-process edges, kept flat on purpose).
        With metrics on, a hop does no metric work unless this chain is timed:
        the Recorder derives its counts when it reports (recorder.py).
        """
        plan = self._plan
        rec = self.recorder
        timed = spans = False
        ended = 0.0  # when the previous stage returned, if nothing ran since (0: read the clock)
        executor, routing = plan[inv.stage]
        payload = inv.payload
        request_id, request = payload.request_id, payload.request  # the same for every stage of the chain
        # A direct hop sets the invocation's Run of direct hops to the next one, prebuilt (trace.Run), and
        # allocates nothing for the trace: `chain` is the runs from the stage whose trace is the
        # invocation's `_base`, `taken` the direct hops made since.
        chain, taken = routing.runs, 0
        if rec is not None:
            # Spans go into the trace only for requests whose timings someone reads
            # (`stagevisor synthesize --timings`, OTLP export); those are always timed.
            spans = request.get("timings") is True
            stats = routing.stats
            stats.starts = starts = stats.starts + 1
            timed = spans or (starts >= stats.next_timed and rec.timing(stats))
            self._live.add(inv)
            trace = inv.trace
            # Only a handoff inside this worker that started a task (fan-out, stream) is accounted on
            # arrival; a chain that a peer's frame started needs nothing here unless it is timed.
            if timed or trace is not None and (trace[1].__class__ is list or trace[1] in self._in_process_edges):
                arrived = self._arrived(trace, timed)
                if timed:
                    ended = arrived  # the first stage starts now
        try:
            while True:
                if timed:
                    started = ended or _now()  # a direct call starts as the previous stage returns
                    if spans:
                        span = [inv.stage, started, 0.0]  # a Span
                        inv.trace = (inv.trace, span)
                        chain, taken = routing.runs, 0
                try:
                    try:
                        result = await executor.process(payload, inv)
                    finally:
                        if timed:
                            ended = _now()
                            if spans:
                                span[2] = ended
                            routing.stats.durations.append(ended - started)
                    data = result
                    if data.__class__ is not dict:  # one check on the hot path; None and dict subclasses below
                        if data is None:
                            data = {}
                        elif not isinstance(data, dict):
                            raise TypeError(f"process() returned {type(data).__qualname__}; expected a dict or None")
                    if routing.sends:
                        await self._send_outputs(inv, routing, data, ended, spans)
                        ended = 0.0  # sending took time: the next stage reads the clock
                except asyncio.CancelledError:
                    if inv._state.cancelled or _cancelled_from_outside():
                        if rec is not None:
                            routing.stats.cancelled += 1
                        raise
                    # The executor raised it itself (a helper task it cancelled, a library's timeout):
                    # nothing else would end the request, which would hang until --pipeline-idle-timeout.
                    log.warning("stage %r failed request %s", inv.stage, inv.request_id, exc_info=True)
                    if rec is not None:
                        routing.stats.failures += 1
                    self._fail(
                        inv._state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: CancelledError",
                        error_type="CancelledError",
                    )
                    return
                except InvalidRequest as error:
                    if rec is not None:
                        routing.stats.failures += 1
                    self._fail(
                        inv._state, inv.stage, pb.FAILURE_CODE_INVALID_ARGUMENT, str(error), client_message=str(error)
                    )
                    return
                except StageError as error:  # its text is written for the client (stages/README.md)
                    log.warning("stage %r failed request %s: %s", inv.stage, inv.request_id, error)
                    if rec is not None:
                        routing.stats.failures += 1
                    detail = str(error) or type(error).__name__
                    self._fail(
                        inv._state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: {detail}",
                        client_message=str(error),
                    )
                    return
                except Exception as error:  # noqa: BLE001 - any executor failure ends only this request
                    log.warning("stage %r failed request %s", inv.stage, inv.request_id, exc_info=True)
                    if rec is not None:
                        routing.stats.failures += 1
                    detail = str(error) or type(error).__name__
                    self._fail(
                        inv._state,
                        inv.stage,
                        pb.FAILURE_CODE_INTERNAL,
                        f"stage '{inv.stage}' failed: {detail}",
                        error_type=type(error).__name__,
                    )
                    return
                direct = routing.direct
                if direct is None:
                    return
                if routing.local_tasks:  # fan-out: all local stages but one run as tasks
                    for dst, in_process_hop in routing.local_tasks:
                        self._start_invocation(
                            Invocation(
                                self,
                                inv._state,
                                dst,
                                StagePayload(request_id, request, data),
                                (inv.trace, in_process_hop),
                            )
                        )
                # The direct call: the same request and data objects, nothing copied. The
                # finished stage's context is reused for the next stage (a context is only
                # valid inside process(), see stages/base.py), so a hop allocates one payload.
                inv.stage, executor, routing = direct
                inv.payload = payload = StagePayload(request_id, request, data)
                inv._direct = chain[taken]
                taken += 1
                inv.inbound = None
        finally:
            if rec is not None:
                self._live.discard(inv)

    def _running_calls(self) -> dict[str, int]:
        """Stage -> calls running now (in process() or handing on its outputs), for the Recorder's reports."""
        running: dict[str, int] = {}
        for inv in self._live:
            running[inv.stage] = running.get(inv.stage, 0) + 1
        return running

    async def _send_outputs(
        self, inv: Invocation, routing: _Routing, data: dict[str, Any], ended: float, spans: bool
    ) -> None:
        """End this stage's streams, submit to remote `next` stages, report a terminal stage done.

        `ended` is when the stage returned (0: not timed); with metrics on, what goes to another
        process carries it (read now if need be) for the receiver's handoff latency. `spans`: the
        request's timings are read (metrics on), so a terminal stage sends them with Done.
        """
        if not ended and routing.remote and self.recorder is not None:
            ended = _now()
        for dst, with_data in routing.ends:
            await self._end_stream(inv, dst, data if with_data else None, ended)
        for dst in routing.remote_next:
            await self._submit_remote(inv, dst, data, ended)
        if routing.terminal:
            frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=SINK)
            frame.done.SetInParent()
            frame.done.trace.extend(flatten(inv.trace))  # in place: Frame(done=Done(...)) copies the message
            if spans:
                to_timings(inv.trace, frame.done.timings)  # only for requests whose timings someone reads
            await self._send(inv._state, self.sink_address, frame)

    def _arrived(self, trace: Trace, timed: bool) -> float:
        """Account the in-process handoff that started this task (fan-out or stream); close a stream hop.

        Returns the time this task started when the clock was read (always for a timed chain), else 0.
        """
        now = _now() if timed else 0.0
        if trace is None:
            return now
        last = trace[1]
        if last.__class__ is list:  # a stream hop's Span: it ends as its receiver starts
            now = now or _now()
            if not last[2]:
                last[2] = now
            name = last[0]
        else:
            name = last
        edge = self._in_process_edges.get(name)
        if edge is not None:
            edge.handoffs += 1
            sent = sent_at(trace)
            if sent:
                now = now or _now()
                edge.latencies.append(now - sent)
        return now

    def _remote_arrival(
        self,
        frame: pb.Frame,
        trace: Trace | None,
        before: tuple[int, int],
        stream: bool,
        link: InboundLink | None = None,
    ) -> None:
        """Account a handoff received over a link: its transport, bytes (with its inline pieces) and latency."""
        mapped, inline = (now - then for now, then in zip(_received(), before, strict=True))
        transport = GRPC_TCP if link is not None and link.tcp else SHARED_MEMORY if mapped else GRPC
        edge = self.recorder.edge(frame.src, frame.dst, transport)
        edge.bytes += frame.ByteSize() + mapped + inline
        if stream:
            edge.chunks += 1
        if trace is not None:
            edge.handoffs += 1
            sent = sent_at(trace)
            if sent:
                edge.latencies.append(_now() - sent)

    def _fail(
        self,
        state: _RequestState,
        stage: str,
        code: pb.FailureCode,
        message: str,
        client_message: str = "",
        error_type: str = "",
    ) -> None:
        """Fail the request at the gateway: `message` for the daemon log, `client_message` (if any) for the client.

        `error_type` is an unexpected exception's class, the one thing of it the client learns."""
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
                    stage=stage, code=code, message=message, client_message=client_message, error_type=error_type
                ),
            ),
        )
        self.cancel(state.request_id, current=asyncio.current_task())

    async def _send(self, state: _RequestState, address: str, frame: pb.Frame) -> None:
        # Taken before the first await: what the codec put out of line belongs to this frame.
        out = self.codec.take_out_of_line()
        try:
            link = self.links.get(address)
        except BaseException:
            self.codec.drop(out.segments)
            raise
        state.links.add(link)
        await link.send_async(frame, out)
        if out.segments:
            await asyncio.sleep(0)  # let the link reader take in released buffers, so the pool reuses them

    def _encode(self, obj: Any, value: pb.Value, peer: str | None = None) -> None:
        try:
            self.codec.encode_into(obj, value, peer)
        except BaseException:
            self.codec.drop(self.codec.take_out_of_line().segments)  # written for a frame never sent
            raise

    def _transport(self, address: str) -> str:
        """The hop label of a frame to `address`: `grpc` (unix, shared memory) or `grpc_tcp` (another node)."""
        return GRPC if self.directory is None else self.directory.transport(address)

    # ---- handoffs ---------------------------------------------------------------

    async def _submit_remote(self, inv: Invocation, dst: str, data: dict[str, Any], ended: float) -> None:
        frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=dst)
        address = self._address(inv._state, dst)
        self._encode(inv.payload.request, frame.submit.request, address)
        self._encode(data, frame.submit.data, address)
        trace = (inv.trace, hop(inv.stage, dst, self._transport(address)))
        frame.submit.trace.extend(flatten(trace))
        if self.recorder is not None:
            if inv.payload.request.get("timings") is True:
                to_timings(trace, frame.submit.timings)
            else:  # just when this stage returned, for the receiver's handoff latency
                to_timings(((None, [inv.stage, ended, ended]), trace[1]), frame.submit.timings)
        await self._send(inv._state, address, frame)

    def _open_local_stream(self, inv: Invocation, dst: str) -> ChunkQueue:
        queue = ChunkQueue(STREAM_WINDOW)
        inv._state.inbound[(inv.stage, dst)] = queue
        payload = StagePayload(inv.request_id, inv.payload.request, {})
        inv._state.stream_payloads[(inv.stage, dst)] = payload
        in_process_hop = hop(inv.stage, dst, IN_PROCESS)
        trace: Any = (inv.trace, in_process_hop)
        if self.recorder is not None:
            trace = (trace, [in_process_hop, _now(), 0.0])
        self._start(inv._state, dst, payload, trace, queue)
        return queue

    def _opening(self, inv: Invocation, dst: str, opening: pb.Opening) -> None:
        address = self._address(inv._state, dst)
        self._encode(inv.payload.request, opening.request, address)
        grpc_hop = hop(inv.stage, dst, self._transport(address))
        trace = (inv.trace, grpc_hop)
        opening.trace.extend(flatten(trace))
        if self.recorder is not None:
            to_timings((trace, [grpc_hop, _now(), 0.0]), opening.timings)

    async def stream_chunk(self, inv: Invocation, chunk: Any) -> None:
        state = inv._state
        for dst in self._routing[inv.stage].stream_targets:
            out = state.outbound.get((inv.stage, dst))
            if out is None:
                if dst in self.executors:
                    out = self._open_local_stream(inv, dst)
                else:
                    out = CreditWindow()
                state.outbound[(inv.stage, dst)] = out
            if isinstance(out, ChunkQueue):
                await out.put(chunk)  # the same object, handed over; waits while the queue is full
                continue
            await out.acquire()
            if state.cancelled or state.failed:
                raise asyncio.CancelledError()
            frame = pb.Frame(request_id=inv.request_id, src=inv.stage, dst=dst)
            address = self.sink_address if dst == SINK else self._address(state, dst)
            self._encode(chunk, frame.chunk.value, address)
            if not out.opened and dst != SINK:
                self._opening(inv, dst, frame.chunk.opening)
            out.opened = True
            await self._send(state, address, frame)

    async def _end_stream(self, inv: Invocation, dst: str, data: dict[str, Any] | None, ended: float) -> None:
        state = inv._state
        out = state.outbound.pop((inv.stage, dst), None)
        if dst in self.executors:
            queue = out if out is not None else self._open_local_stream(inv, dst)
            target = self._stream_payload(state, inv.stage, dst)
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
        if out is None or not out.opened:
            self._opening(inv, dst, end.opening)
        await self._send(state, address, frame)

    def _stream_payload(self, state: _RequestState, src: str, dst: str) -> StagePayload | None:
        return state.stream_payloads.get((src, dst))

    # ---- frames from other nodes ------------------------------------------------

    def on_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        """A frame from a peer's link to this worker; a bad one fails only its own request."""
        try:
            self._on_frame(frame, link)
        except Exception as error:  # noqa: BLE001 - one bad frame must not hurt other requests
            bad_frames_log.warning(
                "refusing a %s frame for request %s: %s", frame.WhichOneof("body"), frame.request_id, error
            )
            self._drop(frame, link)
            self._reject(
                frame.request_id,
                frame.dst,
                pb.FAILURE_CODE_INTERNAL,
                f"worker {self.peer_name!r} could not read a frame of this request: {error}",
            )

    def on_bad_frame(self, bad: BadFrame, link: InboundLink) -> None:
        """A frame that did not parse, or a piece that did not fit: fail its request, if it can be told."""
        bad_frames_log.warning("data-plane peer %s sent %s", link.peer or "?", bad.error)
        if bad.request_id:
            self._reject(
                bad.request_id, "", pb.FAILURE_CODE_INTERNAL, f"worker {self.peer_name!r} received {bad.error}"
            )

    def _on_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        body = frame.WhichOneof("body")
        if body == "cancel":
            self.cancel(frame.request_id)
            return
        if body == "replicas":
            self.apply_replicas(frame.replicas)
            # The daemon waits on the answer before it stops a replica taken out of rotation.
            link.reply(pb.Frame(src=self.peer_name, replicas=pb.Replicas(version=frame.replicas.version)))
            return
        if body == "peers":  # where peers listen, by node (--launcher ray)
            if self.directory is not None:
                self.directory.update(frame.peers.version, ((p.address, p.node_id, p.tcp) for p in frame.peers.peers))
            return
        if body in ("submit", "chunk", "end") and frame.dst not in self.executors:
            self._drop(frame, link)
            self._reject(
                frame.request_id,
                frame.dst,
                pb.FAILURE_CODE_INTERNAL,
                f"stage {frame.dst[:80]!r} is not served by worker {self.peer_name!r}",
            )
            return
        if body not in ("submit", "chunk", "end"):
            log.debug("ignoring %s frame for %s", body, frame.request_id)
            return
        state = self._state(frame.request_id, link)
        if state is None or state.cancelled or state.failed:
            self._drop(frame, link)
            return
        state.touched = time.monotonic()
        rec = self.recorder
        before = _received() if rec is not None else (0, 0)
        if body == "submit":
            payload = StagePayload(
                frame.request_id,
                self.codec.decode(frame.submit.request, link),
                self.codec.decode(frame.submit.data, link),
            )
            trace = from_hops(frame.submit.trace)
            if rec is not None and frame.submit.HasField("timings"):
                timed = from_timings(frame.submit.timings)
                self._remote_arrival(frame, timed, before, stream=False, link=link)
                if payload.request.get("timings") is True:  # the full timings; else only the sender's end
                    trace = timed
            self._start(state, frame.dst, payload, trace)
            return
        message = frame.chunk if body == "chunk" else frame.end
        queue = state.inbound.get((frame.src, frame.dst))
        opened: Trace | None = None
        if queue is None:
            if not message.HasField("opening"):
                self._drop(frame, link)  # its stage already returned; keep the sender's credits flowing
                self._forget_if_idle(state)
                return
            queue, opened = self._open_remote_stream(state, frame, message.opening, link)
        if body == "chunk":
            queue.push(self.codec.decode(frame.chunk.value, link))
        else:
            if frame.end.has_data:
                target = self._stream_payload(state, frame.src, frame.dst)
                if target is not None:
                    target.data.update(self.codec.decode(frame.end.data, link))
            if frame.end.src_end and state.stream_sources:
                source = state.stream_sources.pop((frame.src, frame.dst), None)
                if source is not None:
                    source[2] = frame.end.src_end
            queue.end()
        if rec is not None:
            self._remote_arrival(frame, opened, before, stream=body == "chunk", link=link)

    def _reject(self, request_id: str, stage: str, code: pb.FailureCode, message: str) -> None:
        """Fail a request because of a frame, whether or not this worker holds state for it."""
        state = self._requests.get(request_id)
        if state is not None:
            self._fail(state, stage, code, message)
            return
        if request_id in self._recent_cancels:
            return
        self._remember_cancelled(request_id)  # its later frames are dropped quietly
        self.links.send(
            self.sink_address,
            pb.Frame(
                request_id=request_id, src=stage, dst=SINK, failure=pb.Failure(stage=stage, code=code, message=message)
            ),
        )

    def _open_remote_stream(
        self, state: _RequestState, frame: pb.Frame, opening: pb.Opening, link: InboundLink
    ) -> tuple[ChunkQueue, Trace]:
        """Start the receiving stage of a stream; return its queue and its trace."""
        queue = ChunkQueue(STREAM_WINDOW, on_consumed=partial(link.credit, (frame.request_id, frame.src, frame.dst)))
        state.inbound[(frame.src, frame.dst)] = queue
        state.remote_streams.add((frame.src, frame.dst))
        payload = StagePayload(frame.request_id, self.codec.decode(opening.request, link), {})
        state.stream_payloads[(frame.src, frame.dst)] = payload
        if self.recorder is not None and opening.HasField("timings"):
            trace = from_timings(opening.timings)
            source = next((s for s in _spans_of(trace) if s[0] == frame.src and not s[2]), None)
            if source is not None:  # the sender is still running: its end marker says when it returned
                if state.stream_sources is None:
                    state.stream_sources = {}
                state.stream_sources[(frame.src, frame.dst)] = source
        else:
            trace = from_hops(opening.trace)
        self._start(state, frame.dst, payload, trace, queue)
        return queue, trace

    def _forget_if_idle(self, state: _RequestState) -> None:
        if not state.tasks and self._requests.get(state.request_id) is state:
            del self._requests[state.request_id]
            if state.replicas:
                self._release_replicas(state)

    def _drop(self, frame: pb.Frame, link: InboundLink) -> None:
        # Also after a decode of this frame, whole or partial: only buffers no decode took are released
        # (Codec.decode marks the rest, which its mappings release).
        body = frame.WhichOneof("body")
        if body == "submit":
            discard_shared(frame.submit.request, link)
            discard_shared(frame.submit.data, link)
        elif body == "chunk":
            discard_shared(frame.chunk.value, link)
            link.reply(pb.Frame(request_id=frame.request_id, src=frame.src, dst=frame.dst, credit=pb.Credit(chunks=1)))
        elif body == "end":
            discard_shared(frame.end.data, link)

    def on_reply(self, frame: pb.Frame) -> None:
        """A frame answered on one of this worker's outbound links: stream credits (links take releases)."""
        body = frame.WhichOneof("body")
        if body != "credit":
            return
        state = self._requests.get(frame.request_id)
        out = state.outbound.get((frame.src, frame.dst)) if state else None
        if isinstance(out, CreditWindow):
            out.release(frame.credit.chunks)

    def _stages_at(self, address: str) -> list[str]:
        group = self.router.group_of(address) or address
        return sorted(s for s, a in self.routes.items() if a == group) or ["the gateway"]

    def apply_replicas(self, message: pb.Replicas) -> None:
        """The daemon's word on replicas: which take new requests, which died (their requests fail now)."""
        for entry in message.sets:
            if entry.address not in self.router.groups:
                self._pin_in_flight(entry.address)
            self.router.set_ready(entry.address, entry.ready)
        for replica in message.lost:
            self.replica_lost(replica)

    def _pin_in_flight(self, address: str) -> None:
        """A group at `address` gets replicas: requests that already sent it frames keep it for the rest.

        Until now its frames went to `address` without a pick (a single worker); a later frame of the same
        request (a stream's next chunk, its end) must reach the worker that holds the stream, not whichever
        replica is least busy once the group has several.
        """
        for state in self._requests.values():
            if any(link.address == address for link in state.links):
                if state.replicas is None:
                    state.replicas = {}
                if address not in state.replicas:
                    state.replicas[address] = address
                    self.router.in_flight[address] = self.router.in_flight.get(address, 0) + 1

    def replica_lost(self, replica: str) -> None:
        """Fail the requests this worker routed to a replica that died, held here or already handed on."""
        self.router.mark_down(replica)
        message = (
            f"the worker serving stage {', '.join(map(repr, self._stages_at(replica)))} "
            f"(replica at {replica.rpartition('/')[2]}) went down; retry"
        )
        for state in list(self._requests.values()):
            if state.replicas and replica in state.replicas.values():
                self._fail(state, "", pb.FAILURE_CODE_UNAVAILABLE, message)
        for request_id in self.router.routed_to(replica):
            if request_id not in self._requests:
                self._reject(request_id, "", pb.FAILURE_CODE_UNAVAILABLE, message)
        self.router.forget(replica)

    def on_link_broken(self, link: OutboundLink, error: BaseException) -> None:
        """Fail every request that sent frames on a link that broke (its peer went away)."""
        stages = self._stages_at(link.address)
        if self.router:
            self.router.mark_down(link.address)  # new requests avoid it until the daemon announces it again
        for state in list(self._requests.values()):
            if link in state.links:
                self._fail(
                    state,
                    "",
                    pb.FAILURE_CODE_UNAVAILABLE,
                    f"the worker serving stage {', '.join(map(repr, stages))} became unreachable",
                )

    # ---- cancellation and shutdown ----------------------------------------------

    def _remember_cancelled(self, request_id: str) -> None:
        self._recent_cancels[request_id] = None
        while len(self._recent_cancels) > _RECENT_CANCELS:
            self._recent_cancels.popitem(last=False)

    def cancel(self, request_id: str, current: asyncio.Task | None = None) -> None:
        """Stop all work of a request in this worker and drop its buffered chunks."""
        self._remember_cancelled(request_id)
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        if state.replicas:
            self._release_replicas(state)
        state.cancelled = True
        for queue in state.inbound.values():
            queue.drop()
        for out in state.outbound.values():
            if isinstance(out, CreditWindow):
                out.close()
            else:
                out.drop()
        for task in state.tasks:
            if task is not current:
                task.cancel()

    async def drain(self, grace: float) -> None:
        """Wait up to `grace` seconds for in-flight requests, then cancel what is left.

        Requests whose first frame arrives during the drain are waited for too
        (a sender may have routed one to this replica just before it left the rotation).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        tasks: set[asyncio.Task] = set()
        while self._requests and loop.time() < deadline:
            tasks = {t for s in self._requests.values() for t in s.tasks}
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=deadline - loop.time())
        tasks = {t for s in self._requests.values() for t in s.tasks}
        for request_id in list(self._requests):
            self.cancel(request_id)
        leftover = {t for t in tasks if not t.done()}
        if leftover:
            await asyncio.wait(leftover, timeout=1.0)

    # ---- expiry -------------------------------------------------------------------

    def _watch_idle(self) -> None:
        if self._janitor is None or self._janitor.done():
            self._janitor = asyncio.get_running_loop().create_task(self._expire_idle(), name="expire-idle-streams")

    async def _expire_idle(self) -> None:
        interval = min(max(self.stream_idle_timeout / 4, 0.05), 10.0)
        while self._requests:
            await asyncio.sleep(interval)
            self.expire_idle(time.monotonic())

    def expire_idle(self, now: float) -> int:
        """Fail requests whose stage waits on a stream silent for stream_idle_timeout; return how many."""
        expired = 0
        for state in list(self._requests.values()):
            waiting = [key for key, queue in state.inbound.items() if not queue.ended and not len(queue)]
            # A frame that came over a link feeds the stream, even one naming a local stage as its sender.
            remote = [key for key in waiting if key in state.remote_streams or key[0] not in self.executors]
            if remote and now - state.touched > self.stream_idle_timeout:
                src, dst = remote[0]
                self._fail(
                    state,
                    dst,
                    pb.FAILURE_CODE_UNAVAILABLE,
                    f"stage {dst!r} received nothing from stage {src!r} for "
                    f"{self.stream_idle_timeout:g} s; its sender is gone",
                )
                expired += 1
        return expired

    async def flush(self, timeout: float) -> None:
        """Wait (up to `timeout`) until what was queued on every live link is written: the last chunks and
        completions of a draining worker reach their receivers before it exits."""
        await self.links.flush(timeout)

    async def close(self) -> None:
        if self._janitor is not None:
            self._janitor.cancel()
        await self.links.close()
        self.codec.close()


def _spans_of(trace: Trace) -> list[Span]:
    spans = []
    while trace is not None:
        trace, item = trace
        if item.__class__ is list:
            spans.append(item)
    return spans
