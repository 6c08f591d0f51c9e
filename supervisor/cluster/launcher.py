"""`serve --launcher ray`: each worker (each replica, each TP rank) runs under a Ray actor on a cluster node.

The same WorkerLauncher seam (supervisor/daemon/handle.py) as the local launcher: `start(spec)` returns
a WorkerHandle, and nothing above it (lifecycle, restarts, admin API,
topology, health, metrics) knows which launcher runs the worker. The actor
(supervisor/cluster/host.py) starts the unchanged worker main as its child on its
node and relays the handshake, the exit status and the heartbeat.

Lifetime: actors are owned by the daemon's Ray job (never detached), so Ray
kills them when the daemon stops or dies, however it dies; the worker exits
with its actor. They are named `stagevisor-<daemon id>-<worker>-<start>` in the
`stagevisor` namespace (`ray list actors` finds them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import replace
from typing import Any, Iterable, Mapping, Protocol, Sequence

from stagevisor.supervisor import envs
from stagevisor.supervisor.cluster.connect import NAMESPACE, cluster_nodes, connect
from stagevisor.supervisor.cluster.resources import (
    ActorResources,
    ClusterNode,
    actor_resources,
    check_cluster,
    cluster_lacks,
    per_gpu_limit,
    tp_stages,
)
from stagevisor.supervisor.cluster.worker import RayWorker
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory
from stagevisor.supervisor.errors import DaemonError, StagevisorError
from stagevisor.supervisor.install import install_command
from stagevisor.supervisor.daemon.handle import heartbeat_interval
from stagevisor.supervisor.plan import Plan, ProcessGroup
from stagevisor.supervisor.cluster.host import HOST_CONCURRENCY, WorkerHost
from stagevisor.supervisor.cluster.tp import TpGang
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")

ACTOR_PREFIX = "stagevisor-"
FORWARDED_ENV = ("GRPC_VERBOSITY", "PYTHONPATH")
"""The daemon's variables its workers get on their nodes (and every STAGEVISOR_* one): a local worker inherits
the daemon's whole environment, a Ray worker the node's."""
DATAPLANE_TLS_ENV = envs.DATAPLANE_TLS.name
"""1: TLS on the data plane's TCP links between nodes even without TLS on the public endpoint; 0: never."""


def dataplane_tls(public_tls: bool, environ: Mapping[str, str]) -> bool:
    """Whether TCP links between nodes use TLS: as the public endpoint does, unless DATAPLANE_TLS_ENV says. Pure."""
    value = envs.DATAPLANE_TLS.get(environ).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return public_tls


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the daemon's environment its workers get on their nodes. Pure."""
    return {k: v for k, v in environ.items() if k in FORWARDED_ENV or k.startswith(envs.PREFIX)}


def daemon_id() -> str:
    """How this daemon's actors are told from another's: `<host>-<pid>`."""
    return f"{socket.gethostname().split('.')[0]}-{os.getpid()}"


def actor_name(daemon: str, worker: str, start: int) -> str:
    """`stagevisor-<daemon id>-<worker>-<n>`: the n-th worker this daemon started (a replica's `/` kept). Pure."""
    return f"{ACTOR_PREFIX}{daemon}-{worker}-{start}"


def actor_options(spec: WorkerSpec, resources: ActorResources, name: str) -> dict[str, Any]:
    """The `.options()` of a worker's host actor. Pure.

    Never detached (owned by the daemon's job), never restarted by Ray (the
    daemon restarts it, with its backoff and budget). The replicas of a group
    spread over the nodes that fit (Ray's SPREAD strategy).
    """
    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "max_restarts": 0,
        "max_task_retries": 0,
        "max_concurrency": HOST_CONCURRENCY,
        "num_cpus": 0,
    }
    if spec.worker:  # a replica: best effort over the nodes that fit, rather than packed onto one
        options["scheduling_strategy"] = "SPREAD"
    if resources.gpus:
        options["num_gpus"] = resources.gpus
    if resources.resources:
        options["resources"] = dict(resources.resources)
    return options


class PeerGateway(Protocol):
    """What the Ray launcher asks of the daemon's data-plane gateway: a TCP sink, and where workers run."""

    directory: PeerDirectory | None
    """Where workers run, by node; None until `listen_tcp`."""

    async def listen_tcp(self, node_id: str, host: str, security: DataPlaneSecurity) -> str: ...

    def push_peers(self, peers: Mapping[str, Peer], targets: Iterable[str]) -> int: ...


class RayLauncher:
    """Starts each worker under a Ray actor on the cluster at `address` (the DaemonLauncher protocol)."""

    def __init__(
        self,
        plan: Plan,
        address: str | None = None,
        *,
        heartbeat_timeout: float = 0.0,
        gateway: PeerGateway | None = None,
        tls: bool = False,
    ) -> None:
        self.plan = plan
        self.address = address
        self.heartbeat_timeout = heartbeat_timeout
        self.daemon_id = daemon_id()
        self.host: str | None = None
        """The daemon's node address (its IP): the gateway listens there on TCP for workers on other nodes."""
        self.node_id = ""
        """The daemon's Ray node: workers there use unix sockets and shared memory, others TCP."""
        self.gateway = gateway
        """The daemon's data-plane gateway (supervisor/dataplane/gateway.py): where peers are announced."""
        self.tls = tls
        """TCP links between nodes use TLS (the daemon's public endpoint does)."""
        self.security = DataPlaneSecurity()
        self.live: dict[str, RayWorker] = {}
        """Data-plane address -> its READY worker: who is told where peers are."""
        self._starts = 0
        self._tp: dict[str, TpGang] = {}
        self._ray: Any = None
        self._host: Any = None

    async def prepare(self) -> None:
        """Join the cluster (off the event loop) and check it has what the plan needs (CLUSTER_LACKS)."""
        log.info("joining the Ray cluster at %s", self.address or os.environ.get("RAY_ADDRESS") or "auto")
        try:
            self._ray = await asyncio.to_thread(connect, self.address)
            nodes = await asyncio.to_thread(cluster_nodes, self._ray)
            self.host = self._ray.util.get_node_ip_address()
            self.node_id = self._ray.get_runtime_context().get_node_id()
            check_cluster(self.plan, nodes, self.address or "")
            self.security = await asyncio.to_thread(DataPlaneSecurity.generate, dataplane_tls(self.tls, os.environ))
        except StagevisorError as error:  # CLUSTER_UNREACHABLE, CLUSTER_LACKS: serve prints that code
            raise DaemonError(error.message, code=error.code) from None
        except ImportError as error:
            raise DaemonError(
                f"TLS between Ray nodes needs the `cryptography` package ({error}): "
                f"{install_command('ray')}, or set {DATAPLANE_TLS_ENV}=0"
            ) from None
        if self.gateway is not None:
            sink = await self.gateway.listen_tcp(self.node_id, self.host, self.security)
            log.info(
                "Ray launcher: the data plane crosses nodes over TCP (%s); the daemon's sink listens at %s",
                self.security.describe(),
                sink,
            )
        self._host = self._ray.remote(WorkerHost)
        log.info(
            "Ray launcher: %d alive nodes; workers run as actors %s%s-* in namespace %r",
            len(nodes),
            ACTOR_PREFIX,
            self.daemon_id,
            NAMESPACE,
        )

    def adopt(self, specs: Mapping[str, WorkerSpec]) -> None:
        """Nothing kept per worker (no standby workers under Ray)."""

    async def close(self) -> None:
        """Nothing to release: each worker's actor ends with its worker (RayWorker.close)."""

    def start(self, spec: WorkerSpec) -> RayWorker:
        if self._ray is None:
            raise RuntimeError("RayLauncher.prepare() must run before start()")
        self._starts += 1
        group = spec.group.name
        spec = replace(
            spec,
            env={**forwarded_env(os.environ), **spec.env},
            peers=self._peers(),
            dataplane_token=self.security.token,
            dataplane_tls=(self.security.cert_pem, self.security.key_pem) if self.security.tls else None,
        )
        # From the spec's own group: each replica's spec carries its group's node and fraction.
        resources = actor_resources(spec.group, per_gpu_limit(self.plan))
        name = actor_name(self.daemon_id, spec.group.name, self._starts)
        options = actor_options(spec, resources, name)
        tp = self._tp_rank(spec.group)
        if tp is not None:  # into its bundle of its stage's placement group (supervisor/cluster/tp.py)
            options["scheduling_strategy"] = tp[0].scheduling(tp[1])
        actor = self._host.options(**options).remote(spec, heartbeat_interval(self.heartbeat_timeout), tp is not None)

        def lacks() -> list[str]:
            return _lacks_one(self.plan, group, cluster_nodes(self._ray))

        return RayWorker(
            group,
            actor,
            self._ray,
            heartbeat_timeout=self.heartbeat_timeout,
            name=name,
            lacks=lacks,
            address=spec.address,
            on_ready=self.announce,
            tp=tp,
        )

    def _tp_rank(self, group: ProcessGroup) -> "tuple[TpGang, int] | None":
        """(its stage's TpGang, made at its first rank's start, its rank) for a TP rank; None otherwise."""
        if group.tp_size <= 1:
            return None
        stage = group.stages[0]
        if stage not in self._tp:
            ranks = tp_stages(self.plan)[stage]
            self._tp[stage] = TpGang(self._ray, self.daemon_id, stage, ranks, per_gpu_limit(self.plan))
        return self._tp[stage], group.tp_rank or 0

    def _peers(self) -> dict[str, tuple[str, str]]:
        """Where the sink and each READY worker are now: (node id, TCP address) by data-plane address."""
        directory = self.gateway.directory if self.gateway is not None else None
        return {a: (p.node_id, p.tcp) for a, p in directory.peers.items()} if directory is not None else {}

    def announce(self, worker: RayWorker) -> None:
        """A worker is READY: tell the gateway and every READY worker (it too) where it runs; workers that exited
        since the last announcement hear no more. Each RayWorker this launcher starts calls it before its READY."""
        for address, other in list(self.live.items()):  # workers that exited since hear nothing more
            if other.exited:
                del self.live[address]
        self.live[worker.address] = worker
        if self.gateway is not None:
            self.gateway.push_peers({worker.address: Peer(worker.node_id, worker.data_address)}, list(self.live))


def _lacks_one(plan: Plan, group: str, nodes: Sequence[ClusterNode]) -> list[str]:
    """What the alive nodes lack for one group (its node resource, its GPU share)."""
    return cluster_lacks(replace(plan, groups=tuple(g for g in plan.groups if g.name == group)), nodes)
