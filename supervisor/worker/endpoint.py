"""WorkerEndpoint: a worker process's data-plane endpoint, serving the stages of its process group."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Mapping

from stagevisor.stages.base import Stage
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.cuda_ipc import CudaIpc
from stagevisor.supervisor.dataplane.link.outbound import GRPC_OPTIONS, LEAVE_SETTLE, OutboundLink
from stagevisor.supervisor.dataplane.link.server import serve_links, stop_server
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory, bind_tcp
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.metrics.recorder import REPORT_INTERVAL, Recorder
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger(__name__)


def open_area(path: str) -> shm.SharedArea | None:
    """The daemon's shared-memory area, or None (large payloads then go inline) when it is unusable."""
    if not path:
        return None
    try:
        return shm.SharedArea.open(Path(path))
    except OSError as error:
        # The daemon said so at start when it chose not to create it; this is the worker's side.
        log.info("shared memory not in use (%s); large payloads go inline", error)
        return None


def worker_directory(spec: WorkerSpec) -> PeerDirectory | None:
    """Where this worker's peers run (--launcher ray: the spec names its node); None with the local launcher."""
    if not spec.node_id:
        return None
    peers = {address: Peer(node_id, tcp) for address, (node_id, tcp) in spec.peers.items()}
    security = DataPlaneSecurity(spec.dataplane_token, *(spec.dataplane_tls or (b"", b"")))
    return PeerDirectory(spec.node_id, peers, security)


class WorkerEndpoint:
    """Serves the DataPlane gRPC service for the stages of one worker process.

    Frames for this worker's stages arrive on links other workers and the
    gateway open to `spec.address`; each request runs its stages here as
    asyncio tasks, hands results to local stages by direct call and to the
    others over this endpoint's own outbound links (`spec.routes`), and sends
    terminal chunks, completions and failures to `spec.sink_address`.
    A TP group with tp_rank > 0 serves the endpoint but receives no requests.
    With `spec.metrics`, it reports what its stages measured to the sink every
    REPORT_INTERVAL seconds, and once more as it stops.
    """

    def __init__(self, spec: WorkerSpec, stages: Mapping[str, Stage]) -> None:
        self.spec = spec
        self.stages = dict(stages)
        missing = [s.name for s in spec.stages if s.name not in self.stages and spec.group.tp_rank in (None, 0)]
        if missing:
            raise ValueError(f"worker {spec.name!r} has no executor for stage(s) {', '.join(missing)}")
        self.recorder = Recorder(spec.name) if spec.metrics else None
        self.directory = worker_directory(spec)
        # The daemon's shared memory is on the daemon's node: a worker on another node sends inline.
        shm_dir = "" if self.directory and self.directory.remote(spec.sink_address) else spec.shm_dir
        self.tcp_address = ""
        """host:port this worker listens on for peers on other nodes (--launcher ray); empty: none."""
        self.runtime = StageRuntime(
            stages={s.name: s for s in spec.stages},
            executors=self.stages,
            routes=spec.routes,
            sink_address=spec.sink_address,
            peer_name=spec.name,
            codec=Codec(
                area=open_area(shm_dir),
                pieces=True,
                cuda=CudaIpc.for_worker(spec.group.gpu, spec.address, spec.address_gpus),
            ),
            recorder=self.recorder,
            replicas=spec.replica_routes,
            directory=self.directory,
        )
        self._server: Any = None  # a grpc.aio.Server once started
        self._reporter: asyncio.Task | None = None

    async def start(self) -> None:
        """Bind `spec.address` and start serving; raises when the address cannot be bound."""
        import grpc

        security = self.directory.security if self.directory else None
        self._server = grpc.aio.server(
            options=GRPC_OPTIONS, interceptors=security.interceptors() if security is not None else None
        )
        serve_links(
            self._server,
            self.runtime.on_frame,
            on_closed=self.runtime.on_inbound_closed,
            on_bad_frame=self.runtime.on_bad_frame,
            on_hello=self.runtime.on_hello,
        )
        if self.spec.address.startswith("unix:") and self.directory:
            # On a node of another host the daemon's run directory does not exist: this worker makes it.
            run_dir = Path(self.spec.address[len("unix:") :]).parent
            try:
                run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as error:
                raise OSError(
                    f"cannot create {run_dir} on this node for the worker's unix socket ({error}); set "
                    "STAGEVISOR_RUNTIME_DIR on the daemon to a directory its user may create on every "
                    "node"
                ) from None
        if self._server.add_insecure_port(self.spec.address) == 0 and not self.spec.address.startswith("unix"):
            raise OSError(
                f"cannot bind the data-plane address {self.spec.address}: another process holds it, or this host "
                "has no such address"
            )
        if self.spec.node_ip:
            self.tcp_address = bind_tcp(self._server, self.spec.node_ip, security)
        await self._server.start()
        if self.recorder is not None:
            self._reporter = asyncio.create_task(self._report_every(REPORT_INTERVAL), name="metrics-report")

    def report_metrics(self) -> OutboundLink | None:
        """Send what changed since the last report to the daemon; return the link it went on, if any."""
        report = self.recorder.collect() if self.recorder is not None else None
        if report is None:
            return None
        try:
            link = self.runtime.links.get(self.spec.sink_address)
            link.send(pb.Frame(metrics=report))
            return link
        except Exception:  # noqa: BLE001 - the daemon is going away; metrics are best effort
            log.debug("metrics report not sent", exc_info=True)
            return None

    async def _report_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.report_metrics()

    def in_flight(self) -> int:
        """Requests with work in this worker right now."""
        return self.runtime.in_flight()

    async def stop(self, grace: float) -> None:
        """Finish in-flight work within `grace` seconds, fail at the gateway what remains, tell every peer linked
        here, wait (up to LEAVE_SETTLE) until each has ended its link, so what they sent before they knew is read
        and a request it would open refused at the gateway, close the server (no frame comes in after it), then
        the links, once what they hold (those failures too) is written."""
        await self.runtime.drain(grace)
        if not await self.runtime.settle(LEAVE_SETTLE):
            log.debug(
                "stopping with links still open after %.1fs: what they send from now on is not read", LEAVE_SETTLE
            )
        if self._server is not None:
            await stop_server(self._server)
            self._server = None
        await self.runtime.flush(1.0)
        await self.runtime.codec.released(2.0)  # before the pool's files go: frames naming them may be on their way
        if self._reporter is not None:
            self._reporter.cancel()
            link = self.report_metrics()  # the last deltas, so a restart loses none
            if link is not None:
                await link.flush(1.0)
        await self.runtime.close()
        if self.runtime.codec.area is not None:
            self.runtime.codec.area.close()
