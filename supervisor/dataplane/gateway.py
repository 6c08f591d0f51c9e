"""Gateway: the daemon's side of the data plane; admits requests and collects what terminal stages stream.

What it leans on, each in its own module: `in_flight` (its base class: the requests in flight, failed as
workers, replicas and groups go away), `request_handle` (a request in flight as its caller sees it),
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
    public_code,
    public_field,
    public_failure,
)
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.out_of_line import discard_shared
from stagevisor.supervisor.dataplane.in_flight import InFlight
from stagevisor.supervisor.dataplane.limits import InvalidSynthesisRequest, RequestLimits, check_request_fields
from stagevisor.supervisor.dataplane.link.outbound import GRPC_OPTIONS, LinkPool
from stagevisor.supervisor.dataplane.link.frames import BadFrame, bad_frames_log
from stagevisor.supervisor.dataplane.link.server import InboundLink, serve_links, stop_server
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory, bind_tcp
from stagevisor.supervisor.dataplane.reach import count_paths
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.routing import GATEWAY_PEER
from stagevisor.supervisor.dataplane.routing import SINK
from stagevisor.supervisor.dataplane.shm_setup import open_area
from stagevisor.supervisor.dataplane.terminal_audio import audio_problem, unplayable
from stagevisor.supervisor.dataplane.trace import parse_hop, timing_tuples
from stagevisor.supervisor.errors import RequestFailed, clipped, unexpected_failure
from stagevisor.supervisor.logs import promised
from stagevisor.supervisor.plan import Plan

if TYPE_CHECKING:
    from stagevisor.supervisor.metrics.registry import DaemonMetrics

log = logging.getLogger(__name__)


class Gateway(InFlight):
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
        super().__init__(plan, routes)
        self.admission = admission or Admission()
        self.sink_address = sink_address
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
        self._edge_counts: dict[tuple[str, str], Counter] = {}
        self._server: Any = None  # a grpc.aio.Server once started
        self._accepting = True
        self.metrics: DaemonMetrics | None = None
        """The daemon's metrics: worker reports go to them, the public endpoints meter requests."""
        self.limits = RequestLimits()
        """Per-request caps the public endpoints enforce (RequestGuard); the daemon sets them from its options."""
        self._text_limits: dict[str, int] = {}
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
        self.links = LinkPool(GATEWAY_PEER, self.on_reply, self.on_link_broken, buffers=self.codec)
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
        while self.requests and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for handle in list(self.requests.values()):
            if handle.fail("UNAVAILABLE", "the daemon is shutting down"):
                self.cancel_everywhere(handle.request_id, "daemon shutting down")
        try:
            if self.links is not None:
                await self.links.close()
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
        if not self._accepting or self.links is None:
            raise RequestFailed("UNAVAILABLE", "the daemon is not accepting requests (starting or stopping)")
        request_id = uuid.uuid4().hex
        handle = RequestHandle(self, request_id, self._expected_done, self.limits.pipeline_idle_timeout)
        self.requests[request_id] = handle
        try:
            target = self.routes[self.entry]
            router = self.router
            for address in self.route_addresses:
                # Watch every worker on the route: if its link breaks, the request fails. Of a
                # replicated group only the replica it went to: the others do not hold it. A replicated
                # group with no replica READY gets its requests at its own address (ReplicaRouter.choose):
                # watched here as a single worker is, for its sender may have handed on all it had, and
                # forgotten the request, by the time its link to that address fails.
                if router.groups.get(address):
                    continue
                handle.links.add(self.links.get(address))
            if router and target in router.groups:
                target = handle.replica = router.choose(target, request_id)
                handle.links.add(self.links.get(target))
            frame = pb.Frame(request_id=request_id, src=SINK, dst=self.entry)
            try:
                self.codec.encode_into(request, frame.submit.request, target)
            except BaseException:
                self.codec.drop(self.codec.take_out_of_line().segments)
                raise
            out = self.codec.take_out_of_line()
            frame.submit.data.map.SetInParent()
            # The link holds the pooled buffers until the worker releases them, or drops them if it breaks.
            self.links.send(target, frame, out)
        except Exception as error:
            self.requests.pop(request_id, None)
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
        if self.requests.pop(handle.request_id, None) is None:
            return
        if not handle.ended:
            handle.fail("CANCELLED", "the client cancelled the request")
            self.cancel_everywhere(handle.request_id, "client cancelled")

    def retry_after_unavailable(self) -> int:
        """Seconds a request that failed UNAVAILABLE should wait before it retries (RequestHandle's HandleOwner)."""
        return self.admission.retry_after_unavailable()

    # ---- peers on other nodes (--launcher ray) --------------------------------------------

    async def listen_tcp(self, node_id: str, host: str, security: DataPlaneSecurity) -> str:
        """Also serve the sink on TCP at `host` (a port the system picks) for workers on other Ray nodes, with
        `security`'s token (and TLS); from now on workers are dialled by node (`push_peers`). Returns host:port."""
        import grpc

        self.directory = PeerDirectory(node_id, security=security)
        self.codec.remote = self.directory.remote
        if self.links is not None:
            self.links.directory = self.directory
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
                assert self.links is not None, "the gateway has started"
                self.links.send(address, frame)
            except Exception:  # noqa: BLE001 - a worker that is gone learns the peers when it starts again
                log.debug("peers frame to %s not sent", address, exc_info=True)
        return self._peers_version

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
        handle = self.requests.get(request_id)
        if handle is not None and handle.fail("INTERNAL", message):
            self.cancel_everywhere(request_id, message)

    def _handle_frame(self, frame: pb.Frame, link: InboundLink) -> None:
        handle = self.requests.get(frame.request_id)
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
            self.take_handed_on(frame.handed_on)
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
            if handle.fail(status, message, failure.stage, code=public_code(failure), field=public_field(failure)):
                self.cancel_everywhere(frame.request_id, clipped(failure.message, MAX_ECHOED_CHARS))
        elif body in ("submit", "end"):
            discard_shared(frame.submit.request if body == "submit" else frame.end.data, link)
            if body == "submit":
                discard_shared(frame.submit.data, link)
