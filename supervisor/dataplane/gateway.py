"""Gateway: the daemon's side of the data plane; admits requests and collects what terminal stages stream.

What it leans on, each in its own module: `request_handle` (a request in flight as its caller sees it),
`client_failures` (what a client is told), `terminal_audio` (what a terminal chunk must be), `reach` (what a
request reaches in the plan), `shm_setup` (shared memory or the inline fallback at start).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from stagevisor.stages.base import DEFAULT_MAX_TEXT_CHARS
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.admission import Admission
from stagevisor.supervisor.dataplane.client_failures import (
    MAX_ECHOED_CHARS,
    STAGE_FAILURE_LOGGED,
    group_down,
    public_code,
    public_failure,
    replica_down,
    worker_unreachable,
)
from stagevisor.supervisor.dataplane.codec import Codec, discard_shared
from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest, RequestLimits, check_request_fields
from stagevisor.supervisor.dataplane.link import (
    GRPC_OPTIONS,
    BadFrame,
    InboundLink,
    LinkPool,
    bad_frames_log,
    out_of_descriptors,
    serve_links,
    stop_server,
)
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory, bind_tcp
from stagevisor.supervisor.dataplane.reach import count_paths, groups_by_address, reachable
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.routing import GATEWAY_PEER
from stagevisor.supervisor.dataplane.runtime import SINK
from stagevisor.supervisor.dataplane.shm_setup import open_area
from stagevisor.supervisor.dataplane.terminal_audio import audio_problem, unplayable
from stagevisor.supervisor.dataplane.trace import parse_hop, timing_tuples
from stagevisor.supervisor.errors import RequestFailed, clipped, unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

log = logging.getLogger(__name__)


class Gateway:
    """Admits synthesis requests into the pipeline and collects what terminal stages stream back.

    The first stage of the plan (config order) is the entry; terminal stages
    (no `next`) stream their chunks to the client. A request fans out along
    `next` lists and is done when every terminal stage on its route has
    finished. Workers dial the gateway's sink (`sink_address`) to deliver
    chunks, completions and failures; the gateway dials every worker on a
    request's route, which both carries submissions and cancels and notices at
    once when a worker goes away.
    """

    def __init__(
        self,
        plan: Plan,
        routes: Mapping[str, str],
        sink_address: str,
        *,
        admission: Admission | None = None,
        shm_root: Path | None = None,
        max_concurrent_requests: int | None = None,
    ) -> None:
        self.plan = plan
        self.admission = admission or Admission()
        self.routes = dict(routes)
        self.sink_address = sink_address
        self.entry = plan.stages[0].name
        self.shm_root = shm_root if shm_root is not None else shm.shm_root()
        self.shm_dir = str(shm.new_area_path(self.shm_root))
        """The private shared-memory directory this daemon creates at start (workers get it in their spec)."""
        # Room for every request the admission limit lets run at once (unbounded: an assumed count).
        concurrent = max_concurrent_requests or self.admission.limits.max_concurrent or shm.DEFAULT_CONCURRENT_REQUESTS
        self.shm_needed = shm.bytes_per_request() * concurrent
        self.shm_room: shm.Room | None = None
        """What the start-up check found; `.ok` False means large payloads go inline."""
        self._area: shm.SharedArea | None = None
        self.codec = Codec(pieces=True)
        self._expected_done = count_paths(plan, self.entry)
        reached = reachable(plan, self.entry)
        self._route_addresses = sorted({self.routes[s] for s in reached if s in self.routes})
        self._groups_at = groups_by_address(plan, self.routes, reached)
        self._requests: dict[str, RequestHandle] = {}
        self._edge_counts: dict[tuple[str, str], Counter] = {}
        self._server: Any = None  # a grpc.aio.Server once started
        self._links: LinkPool | None = None
        self._accepting = True
        self.metrics: DaemonMetrics | None = None
        """The daemon's metrics: worker reports go to them, the public endpoints meter requests."""
        self.limits = RequestLimits()
        """Per-request caps the public endpoints enforce (RequestGuard); the daemon sets them from its options."""
        self._text_limits: dict[str, int] = {}
        self.router = ReplicaRouter()
        """READY replicas of replicated groups (the daemon's `push_replicas`); empty when none is replicated."""
        self._replicas_version = 0
        self._acks: dict[str, int] = {}
        self._lost: set[str] = set()
        """Replicas reported lost that no new worker has taken since: a request reported handed on to one fails."""
        self.directory: PeerDirectory | None = None
        """Where workers run, by Ray node (--launcher ray, `listen_tcp`); None: every worker on this host."""
        self._tcp_server = None
        self._peers_version = 0
        self.successor: Gateway | None = None
        """The gateway new requests go to once a live topology change retired this one (`retire`)."""

    # ---- limits -----------------------------------------------------------------

    def declare_text_limit(self, group: str, max_text_chars: int | None) -> None:
        """Record the `max_text_chars` a group's executors declared when its worker became READY."""
        if max_text_chars is None:
            self._text_limits.pop(group, None)
        else:
            self._text_limits[group] = int(max_text_chars)

    @property
    def max_text_chars(self) -> int:
        """The longest text admitted: the smallest limit any executor declared, else the Stage contract's default."""
        return min(self._text_limits.values(), default=DEFAULT_MAX_TEXT_CHARS)

    @property
    def stage_groups(self) -> dict[str, str]:
        """Each stage's process group in this gateway's topology."""
        return {stage.name: self.plan.group_of(stage.name).name for stage in self.plan.stages}

    # ---- lifecycle --------------------------------------------------------------

    async def start(self) -> None:
        """Set up shared memory (or the inline fallback) and serve the sink on `sink_address`."""
        import grpc

        self._start_shared_memory()
        self._links = LinkPool(GATEWAY_PEER, self._on_reply, self._on_link_broken, buffers=self.codec)
        self._server = grpc.aio.server(options=GRPC_OPTIONS)
        serve_links(self._server, self._on_frame, on_bad_frame=self._on_bad_frame)
        self._server.add_insecure_port(self.sink_address)
        await self._server.start()

    def _start_shared_memory(self) -> None:
        self.shm_room, self._area = open_area(self.shm_root, self.shm_dir, self.shm_needed)
        self.codec = Codec(area=self._area, pieces=True)

    def stop_accepting(self) -> None:
        """Refuse new requests with UNAVAILABLE from now on; requests in flight go on (the drain)."""
        self._accepting = False
        if self.successor is None:
            self.admission.drain()  # queued requests never reached a worker: they end now

    def retire(self, successor: "Gateway") -> None:
        """Hand every new request to `successor` (the gateway of a topology applied live); requests in flight
        here go on. The admission queue they share is the successor's from now on: stopping this gateway
        leaves it alone."""
        self.successor = successor
        self._accepting = False

    async def stop(self, grace: float) -> None:
        """Stop admitting, wait up to `grace` for in-flight requests, cancel the rest, clean up."""
        self.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0.0)
        while self._requests and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for handle in list(self._requests.values()):
            if handle.fail("UNAVAILABLE", "the daemon is shutting down"):
                self.cancel_everywhere(handle.request_id, "daemon shutting down")
        try:
            if self._links is not None:
                await self._links.close()
            if self._server is not None:
                await stop_server(self._server)
                self._server = None
            if self._tcp_server is not None:
                await stop_server(self._tcp_server)
                self._tcp_server = None
        finally:
            self.codec.close()
            if self._area is not None:
                self._area.remove()
                self._area = None

    def remove_shared_area(self) -> None:
        """Remove the shared-memory directory, whatever is in it, once no worker writes there any more.

        stop() removes it too, but the daemon stops its data plane before its workers: a file a worker made
        while that removal ran would keep the directory in /dev/shm after a clean shutdown."""
        shm.remove_area(Path(self.shm_dir))

    def shared_files(self) -> int:
        """Files in this daemon's shared-memory directory now (0 when it is not in use)."""
        return len(self._area.files()) if self._area is not None else 0

    def sweep_shared(self) -> int:
        """Remove shared buffers of workers that are gone (a killed worker's pool); return how many."""
        if self._area is None:
            return 0
        try:
            return self._area.sweep_dead_writers()
        except OSError:
            log.debug("shared-memory sweep failed", exc_info=True)
            return 0

    # ---- requests ---------------------------------------------------------------

    async def submit(self, request: dict[str, Any]) -> RequestHandle:
        """Admit a request (waiting in the queue if need be), then `open` it; what both transports call.

        Raises AdmissionRejected, before anything reaches a worker, when the
        daemon is full, the wait outlasts the queue timeout, or it is draining.
        """
        if not self._accepting:
            if self.successor is not None:
                return await self.successor.submit(request)
            raise self.admission.reject("DRAINING")
        slot = await self.admission.acquire()
        if not self._accepting and self.successor is not None:  # retired while this request waited its turn
            slot.release()
            return await self.successor.submit(request)
        try:
            handle = self.open(request)
        except BaseException:
            slot.release()
            raise
        handle.slot = slot
        return handle

    def open(self, request: dict[str, Any]) -> RequestHandle:
        """Submit a request to the entry stage; iterate the handle for its chunks, then close it."""
        try:
            check_request_fields(request, self.max_text_chars)
        except InvalidSynthesisRequest as error:
            raise RequestFailed("INVALID_ARGUMENT", str(error)) from None
        if not self._accepting or self._links is None:
            raise RequestFailed("UNAVAILABLE", "the daemon is not accepting requests (starting or stopping)")
        request_id = uuid.uuid4().hex
        handle = RequestHandle(self, request_id, self._expected_done, self.limits.pipeline_idle_timeout)
        self._requests[request_id] = handle
        try:
            target = self.routes[self.entry]
            router = self.router
            for address in self._route_addresses:
                # Watch every worker on the route: if its link breaks, the request fails. Of a
                # replicated group only the replica it went to: the others do not hold it. A replicated
                # group with no replica READY gets its requests at its own address (ReplicaRouter.choose):
                # watched here as a single worker is, for its sender may have handed on all it had, and
                # forgotten the request, by the time its link to that address fails.
                if router.groups.get(address):
                    continue
                handle.links.add(self._links.get(address))
            if router and target in router.groups:
                target = handle.replica = router.choose(target, request_id)
                handle.links.add(self._links.get(target))
            frame = pb.Frame(request_id=request_id, src=SINK, dst=self.entry)
            try:
                self.codec.encode_into(request, frame.submit.request, target)
            except BaseException:
                self.codec.drop(self.codec.take_out_of_line().segments)
                raise
            out = self.codec.take_out_of_line()
            frame.submit.data.map.SetInParent()
            # The link holds the pooled buffers until the worker releases them, or drops them if it breaks.
            self._links.send(target, frame, out)
        except Exception as error:
            self._requests.pop(request_id, None)
            if handle.replica is not None:
                self.router.release(handle.replica)
            # Encoding or sending failed in the daemon (a full shared-memory area, a codec bug): its text may
            # name paths, so the client gets the class and this request's id, the log the rest.
            log.exception("request %s could not be submitted", request_id, extra=promised(request_id))
            raise unexpected_failure(error, request_id) from None
        return handle

    def close_request(self, handle: RequestHandle) -> None:
        """Take a closed handle off the books (RequestHandle.close); cancel the request everywhere if it is still on."""
        if handle.slot is not None:
            handle.slot.release()
        replica, handle.replica = handle.replica, None
        if replica is not None:
            self.router.release(replica)
        if self._requests.pop(handle.request_id, None) is None:
            return
        if not handle.ended:
            handle.fail("CANCELLED", "the client cancelled the request")
            self.cancel_everywhere(handle.request_id, "client cancelled")

    def cancel_everywhere(self, request_id: str, reason: str) -> None:
        if self._links is None:
            return
        addresses = self._route_addresses
        if self.router:  # every replica: the gateway does not know which one a worker chose
            addresses = [*addresses, *(a for a in self.router.known if a not in self.routes.values())]
        for address in addresses:
            try:
                self._links.send_if_linked(address, pb.Frame(request_id=request_id, cancel=pb.Cancel(reason=reason)))
            except Exception:  # noqa: BLE001 - a dead worker has nothing left to cancel
                log.debug("cancel to %s not sent", address, exc_info=True)

    def retry_after_unavailable(self) -> int:
        """Seconds a request that failed UNAVAILABLE should wait before it retries (RequestHandle's HandleOwner)."""
        return self.admission.retry_after_unavailable()

    def in_flight(self) -> int:
        """Requests admitted and not yet closed (for draining on SIGTERM)."""
        return len(self._requests)

    def fail_group(self, group: str, reason: str) -> None:
        """End every in-flight request whose route touches `group` with UNAVAILABLE naming the group."""
        try:
            stages = self.plan.group(group).stages
        except KeyError:
            return
        addresses = {self.routes[s] for s in stages if s in self.routes}
        if addresses & set(self._route_addresses):
            self._fail_all(group_down(stages, group, reason), stage=stages[0] if len(stages) == 1 else "")
        self.sweep_shared()

    # ---- peers on other nodes (--launcher ray) --------------------------------------------

    async def listen_tcp(self, node_id: str, host: str, security: DataPlaneSecurity) -> str:
        """Also serve the sink on TCP at `host` (a port the system picks) for workers on other Ray nodes, with
        `security`'s token (and TLS); from now on workers are dialled by node (`push_peers`). Returns host:port."""
        import grpc

        self.directory = PeerDirectory(node_id, security=security)
        self.codec.remote = self.directory.remote
        if self._links is not None:
            self._links.directory = self.directory
        server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=security.interceptors())
        serve_links(server, self._on_frame, on_bad_frame=self._on_bad_frame)
        address = bind_tcp(server, host, security)
        await server.start()
        self._tcp_server = server
        self.directory.peers[self.sink_address] = Peer(node_id, address)
        return address

    def push_peers(self, peers: Mapping[str, Peer], targets: Iterable[str]) -> int:
        """Take in where workers run and send it, as a Peers frame, to every worker at `targets` (addresses).

        Sent on the gateway's link to each worker, so it arrives before any request the gateway sends it later.
        """
        if self.directory is None:
            return 0
        self._peers_version += 1
        self.directory.update(self._peers_version, ((a, p.node_id, p.tcp) for a, p in peers.items()))
        message = pb.Peers(version=self._peers_version)
        for address, peer in self.directory.peers.items():
            message.peers.add(address=address, node_id=peer.node_id, tcp=peer.tcp)
        frame = pb.Frame(peers=message)
        for address in targets:
            try:
                assert self._links is not None, "the gateway has started"
                self._links.send(address, frame)
            except Exception:  # noqa: BLE001 - a worker that is gone learns the peers when it starts again
                log.debug("peers frame to %s not sent", address, exc_info=True)
        return self._peers_version

    # ---- replicas -------------------------------------------------------------------

    def push_replicas(
        self, sets: Mapping[str, tuple[str, ...]], lost: tuple[str, ...], workers: Mapping[str, str]
    ) -> int:
        """Announce which replicas take new requests (`sets`: group address -> READY replicas) and which died.

        Applied here at once; sent to every worker in `workers` (name -> address)
        as a Replicas frame, which each answers with the version this returns
        (`wait_replicas`). Requests the gateway sent to a lost replica fail now;
        workers fail those they routed there.
        """
        self._replicas_version += 1
        message = pb.Replicas(version=self._replicas_version, lost=list(lost))
        for address, ready in sets.items():
            if address not in self.router.groups:
                self._pin_in_flight(address)
            back = self.router.set_ready(address, ready)
            if back:
                self._forget_handed_to(back)
                self._lost -= back
            message.sets.add(address=address, ready=list(ready))
        for replica in lost:
            self.replica_lost(replica)
        if self._links is not None:
            frame = pb.Frame(replicas=message)
            for address in workers.values():
                try:
                    self._links.send(address, frame)
                except Exception:  # noqa: BLE001 - a worker that is gone learns the state when it is READY again
                    log.debug("replicas frame to %s not sent", address, exc_info=True)
        return self._replicas_version

    def _pin_in_flight(self, address: str) -> None:
        """The entry group at `address` gets replicas: the requests sent to its one worker until now count as
        held by the replica at that address (that worker's), so a drain of it waits for them as for requests
        routed to it from now on."""
        if self.routes.get(self.entry) != address:
            return  # the gateway sends requests to the entry only; senders pin what they sent to other groups
        for handle in self._requests.values():
            if handle.replica is None and not handle.ended:
                handle.replica = address
                self.router.in_flight[address] = self.router.in_flight.get(address, 0) + 1

    def _forget_handed_to(self, replicas: set[str]) -> None:
        """New workers took these replicas' addresses: the old ones ended, having answered or failed what they
        held (or been reported lost), so the loss of a new one fails none of the requests handed to an old one."""
        for handle in self._requests.values():
            if handle.handed_to & replicas:
                handle.handed_to -= replicas

    def _take_handed_on(self, handed_on: pb.HandedOn) -> None:
        """A stopping worker says where it routed requests among replicas: watch those still in flight there, or
        fail them now where that replica was lost before the report came (none is left to fail them later)."""
        replica = handed_on.replica
        held = [self._requests.get(request_id) for request_id in handed_on.request_ids]
        for handle in (h for h in held if h is not None and not h.ended):
            handle.handed_to |= {replica}
        if replica in self._lost:
            self._fail_held_by(replica)

    async def wait_replicas(self, version: int, workers: Mapping[str, str], timeout: float) -> list[str]:
        """Wait until every worker answered `version`; return the names that did not within `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            missing = [name for name in workers if self._acks.get(name, 0) < version]
            if not missing or loop.time() >= deadline:
                return missing
            await asyncio.sleep(0.01)

    def request_ids(self) -> frozenset[str]:
        """The requests in flight now, whatever worker holds them (a restart waits for those its old worker may)."""
        return frozenset(self._requests)

    def replica_in_flight(self, replica: str) -> int:
        """Requests the gateway sent to this replica (of the entry group) that have not ended."""
        return self.router.in_flight.get(replica, 0)

    def replica_lost(self, replica: str) -> None:
        """A replica's worker died: fail the requests sent to it (by the gateway, or by a worker that has stopped
        since), route new ones elsewhere."""
        self.router.mark_down(replica)
        self._lost.add(replica)
        self._fail_held_by(replica)
        self.sweep_shared()

    def _fail_held_by(self, replica: str) -> None:
        """Fail the requests in flight that the lost `replica` held: sent there by the gateway or reported handed on."""
        group = self.router.group_of(replica) or replica
        stages = sorted(s for s, a in self.routes.items() if a == group)
        message = replica_down(stages)
        for handle in list(self._requests.values()):
            held = handle.replica == replica or replica in handle.handed_to
            if held and handle.fail("UNAVAILABLE", message, stages[0] if len(stages) == 1 else ""):
                self.cancel_everywhere(handle.request_id, message)

    def _fail_all(self, message: str, stage: str = "") -> None:
        # Every request's route is the whole reachable pipeline, so all in-flight requests touch it.
        for handle in list(self._requests.values()):
            if handle.fail("UNAVAILABLE", message, stage):
                self.cancel_everywhere(handle.request_id, message)

    # ---- transports actually used ----------------------------------------------

    def edge_transports(self) -> dict[tuple[str, str], str]:
        """(src, dst) -> "in_process", "grpc" or "grpc_tcp" (or "mixed") as completed requests actually used it."""
        return {edge: ("mixed" if len(c) > 1 else next(iter(c))) for edge, c in self._edge_counts.items()}

    def edge_requests(self) -> dict[tuple[str, str], dict[str, int]]:
        """(src, dst) -> {transport: completed requests that crossed the edge that way}."""
        return {edge: dict(c) for edge, c in self._edge_counts.items()}

    # ---- frames from workers ----------------------------------------------------

    def _on_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        try:
            self._handle_frame(frame, link)
        except Exception as error:  # noqa: BLE001 - a bad frame fails only its own request
            bad_frames_log.warning(
                "refusing a %s frame for request %s: %s", frame.WhichOneof("body"), frame.request_id, error
            )
            if frame.WhichOneof("body") == "chunk":
                discard_shared(frame.chunk.value, link)
            self._fail_request(frame.request_id, f"a worker sent a frame the daemon could not read: {error}")

    def _on_bad_frame(self, bad: BadFrame, link: InboundLink) -> None:
        bad_frames_log.warning("data-plane peer %s sent %s", link.peer or "?", bad.error)
        if bad.request_id:
            self._fail_request(bad.request_id, f"a worker sent {bad.error}")

    def _fail_request(self, request_id: str, message: str) -> None:
        handle = self._requests.get(request_id)
        if handle is not None and handle.fail("INTERNAL", message):
            self.cancel_everywhere(request_id, message)

    def _handle_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        handle = self._requests.get(frame.request_id)
        body = frame.WhichOneof("body")
        if body == "chunk":
            stream = (frame.request_id, frame.src, frame.dst)
            if handle is None or handle.ended:
                discard_shared(frame.chunk.value, link)
                link.credit(stream)
                return
            chunk = self.codec.decode(frame.chunk.value, link)
            problem = audio_problem(chunk)
            if problem is None:
                rate = int(chunk["sample_rate"])
                if handle.sample_rate and rate != handle.sample_rate:
                    problem = f"audio at {rate} Hz after audio at {handle.sample_rate} Hz"
                handle.sample_rate = rate
            if problem is not None:
                link.credit(stream)
                message = unplayable(frame.src, problem)
                if handle.fail("INTERNAL", message, frame.src):
                    log.warning("request %s failed in stage %r: %s", frame.request_id, frame.src, message)
                    self.cancel_everywhere(frame.request_id, message)
                return
            handle.push(chunk, lambda: link.credit(stream))
        elif body == "keepalive" and handle is not None:
            handle.keep_alive()
        elif body == "handed_on":
            self._take_handed_on(frame.handed_on)
        elif body == "metrics":
            if self.metrics is not None:
                self.metrics.apply_report(frame.metrics)
        elif body == "done" and handle is not None:
            hops = tuple(parse_hop(h) for h in frame.done.trace)
            if frame.done.HasField("timings"):
                handle.timings.extend(timing_tuples(frame.done.timings))
            if handle.finish_branch(hops):
                for src, dst, transport in handle.hops:
                    self._edge_counts.setdefault((src, dst), Counter())[transport] += 1
        elif body == "failure" and handle is not None:
            failure = frame.failure
            status, message = public_failure(failure)
            if status == "INTERNAL":  # the client was told the daemon log has the details under this id
                log.warning(
                    STAGE_FAILURE_LOGGED,
                    frame.request_id,
                    failure.stage,
                    f" ({failure.error_type})" if failure.error_type else "",
                    clipped(failure.message),
                    extra=promised(frame.request_id),
                )
            if handle.fail(status, message, failure.stage, code=public_code(failure)):
                self.cancel_everywhere(frame.request_id, clipped(failure.message, MAX_ECHOED_CHARS))
        elif body in ("submit", "end"):
            discard_shared(frame.submit.request if body == "submit" else frame.end.data, link)
            if body == "submit":
                discard_shared(frame.submit.data, link)

    def _on_reply(self, frame: pb.Frame) -> None:
        body = frame.WhichOneof("body")
        if body == "replicas":  # a worker took in a Replicas frame
            self._acks[frame.src] = max(self._acks.get(frame.src, 0), frame.replicas.version)
            return
        if body == "leaving":  # a worker stops: what it still held fails now, in its words (the link keeps the rest)
            failure = pb.Failure(code=pb.FAILURE_CODE_UNAVAILABLE, message=frame.leaving.message)
            status, message = public_failure(failure)
            for request_id in frame.leaving.failed:
                handle = self._requests.get(request_id)
                if handle is not None and handle.fail(status, message, code=public_code(failure)):
                    self.cancel_everywhere(request_id, clipped(failure.message, MAX_ECHOED_CHARS))
            return
        # Workers answer on the gateway's links only with Release frames, which the links take in.
        log.debug("ignoring a %s reply from a worker", frame.WhichOneof("body"))

    def _on_link_broken(self, link: Any, error: BaseException) -> None:
        address = self.router.group_of(link.address) or link.address
        descriptors = out_of_descriptors(error)
        if self.router and not descriptors:  # for want of descriptors here the replica is fine: kept in rotation
            self.router.mark_down(link.address)
        groups = self._groups_at.get(address, [link.address])
        stages = sorted(s for s, a in self.routes.items() if a == address)
        message = worker_unreachable(stages, groups, descriptors)
        for handle in list(self._requests.values()):
            if handle.request_id in link.left:  # its work there ended before the worker stopped: it goes on
                continue
            if link in handle.links and handle.fail("UNAVAILABLE", message, stages[0] if len(stages) == 1 else ""):
                self.cancel_everywhere(handle.request_id, message)
        self.sweep_shared()
