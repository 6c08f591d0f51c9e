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
import signal
import socket
import sys
from dataclasses import replace
from typing import Any, Callable, Coroutine, Iterable, Mapping, ParamSpec, Protocol, Sequence, TypeVar

from stagevisor.supervisor import envs
from stagevisor.supervisor.addresses import host_port
from stagevisor.supervisor.cluster.resources import (
    ActorResources,
    ClusterNode,
    actor_resources,
    alive_nodes,
    check_cluster,
    cluster_lacks,
    per_gpu_limit,
    tp_stages,
)
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory
from stagevisor.supervisor.errors import DaemonError, ErrorCode, StagevisorError, WorkerStartError, install_command
from stagevisor.supervisor.daemon.handle import (
    Handshake,
    describe_exit,
    describe_silence,
    describe_unresponsive,
    heartbeat_interval,
    silence_limit,
)
from stagevisor.supervisor.plan import Plan, ProcessGroup
from stagevisor.supervisor.cluster.actor import HostActor, RemoteMethod
from stagevisor.supervisor.cluster.host import HOST_CONCURRENCY, WorkerHost
from stagevisor.supervisor.cluster.tp import TpGang
from stagevisor.supervisor.worker.handshake import WorkerFailed, WorkerReady
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")

P = ParamSpec("P")
R = TypeVar("R")

NAMESPACE = "stagevisor"
ACTOR_PREFIX = "stagevisor-"
FORWARDED_ENV = ("GRPC_VERBOSITY", "PYTHONPATH")
"""The daemon's variables its workers get on their nodes (and every STAGEVISOR_* one): a local worker inherits
the daemon's whole environment, a Ray worker the node's."""
DATAPLANE_TLS_ENV = envs.DATAPLANE_TLS.name
"""1: TLS on the data plane's TCP links between nodes even without TLS on the public endpoint; 0: never."""
CLUSTER_CONNECT_TIMEOUT = 5.0
"""Seconds for a TCP connection to an explicit cluster address before joining: at an address nothing answers,
Ray's driver retries for many minutes inside its C++ client, where Ctrl-C and SIGTERM wait for it."""
REPLY_GRACE = 30.0
"""Seconds beyond a worker's own timeout the daemon waits for its actor's answer (scheduling, a slow node)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise StagevisorError(
            ErrorCode.CLUSTER_UNREACHABLE,
            f"--launcher ray needs Ray on this host and every node: {install_command('ray')}",
        ) from None
    return ray


def unreachable(address: str, timeout: float = CLUSTER_CONNECT_TIMEOUT) -> str | None:
    """Why nothing takes a connection at a cluster address of the form `[ray://]host:port` (None: something does,
    or the address has another form, such as `auto`, which Ray resolves itself)."""
    target = host_port(address.removeprefix("ray://"))
    if target is None:
        return None
    try:
        with socket.create_connection(target, timeout=timeout):
            return None
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__


def connect(address: str | None) -> Any:
    """Join the cluster at `address` (None: RAY_ADDRESS, else a running local one) as a driver; return ray."""
    ray = import_ray()
    if not ray.is_initialized():
        target = address or os.environ.get("RAY_ADDRESS") or "auto"
        why = unreachable(target)
        if why is not None:
            raise StagevisorError(
                ErrorCode.CLUSTER_UNREACHABLE,
                f"cannot join the Ray cluster at {target} (--ray-address): nothing takes a connection there "
                f"({why}); start it (`ray start --head`) or give its address",
            )
        if not sys.stderr.isatty():
            # The workers' lines Ray forwards (log_to_driver) get colour codes unless told not to:
            # in a log file, a journal or a pipe they are noise. An operator's own setting wins.
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        try:
            ray.init(
                address=target,
                namespace=NAMESPACE,
                log_to_driver=True,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise StagevisorError(
                ErrorCode.CLUSTER_UNREACHABLE,
                f"cannot join the Ray cluster at {target} (--ray-address): "
                f"{_first_line(error)}; start it (`ray start --head`) or give its address",
            ) from None
    return ray


def cluster_nodes(ray: Any) -> list[ClusterNode]:
    return alive_nodes(ray.nodes())


def check_plan_on_cluster(plan: Plan, address: str | None) -> None:
    """Join the cluster (from the main thread, before the daemon's loop: `serve` stays joined) and raise
    CLUSTER_LACKS when it lacks what the plan needs (then leave it)."""
    ray = connect(address)
    try:
        check_cluster(plan, cluster_nodes(ray), address or "")
    except BaseException:
        ray.shutdown()
        raise


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


class RayWorker:
    """The WorkerHandle of a worker under a Ray actor (the protocol of supervisor/daemon/handle.py)."""

    def __init__(
        self,
        group: str,
        actor: HostActor,
        ray: Any,
        *,
        heartbeat_timeout: float,
        name: str,
        lacks: Callable[[], list[str]] = list,
        address: str = "",
        on_ready: Callable[["RayWorker"], None] | None = None,
        tp: "tuple[TpGang, int] | None" = None,
    ) -> None:
        self.group = group
        self.tp = tp
        """(its stage's TpGang, its rank) for a TP rank: its actor starts the worker once every rank reported."""
        self.actor = actor
        self.name = name
        self.pid = 0
        self.host = ""
        self.heartbeat_timeout = heartbeat_timeout
        self._ray = ray
        self._lacks = lacks
        self._exit: asyncio.Future[int | None] | None = None
        self._code: int | None = None
        self.address = address
        """Its data-plane address in `routes`."""
        self.node_id = ""
        self.data_address = ""
        """host:port it listens on for peers on other nodes (from its READY handshake)."""
        self._on_ready = on_ready

    async def _call(self, method: RemoteMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Call `method` of the actor and wait for its answer; the call is sent once this is awaited."""
        return await self._call_within(None, method, *args, **kwargs)

    async def _call_within(
        self, timeout: float | None, method: RemoteMethod[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`_call`, giving up with asyncio.TimeoutError after `timeout` seconds (None: never)."""
        ref = method.remote(*args, **kwargs)
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)

    async def handshake(self, timeout: float) -> Handshake:
        """READY from the worker on its node; WorkerStartError on FAILED, death, or no node that fits."""
        ray = self._ray
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            if self.tp is None:
                self.pid = await self._placed(self._call(self.actor.pid), timeout, deadline)
            else:
                devices = await self._placed(self._call(self.actor.devices), timeout, deadline)
                self.pid = await self._launch_rank(devices, deadline)
            left = max(0.0, deadline - loop.time())
            reply = await self._call_within(left + REPLY_GRACE, self.actor.handshake, left)
        except asyncio.TimeoutError:
            raise WorkerStartError(
                self.group,
                f"the Ray actor {self.name} of {self.group!r} did not answer within {timeout + REPLY_GRACE:g}s",
            ) from None
        except ray.exceptions.RayError as error:
            lacks = await asyncio.to_thread(self._lacks)  # its node went away, and with it the last that fits?
            why = f"; Ray cannot place it again (CLUSTER_LACKS): {'; '.join(lacks)}" if lacks else ""
            raise WorkerStartError(
                self.group,
                f"the Ray actor {self.name} of {self.group!r} died before the "
                f"worker was READY: {_first_line(error)}{why}",
            ) from None
        self.host = reply.hostname
        where = f"on node {reply.hostname} ({reply.node_id[:12]})"
        report = reply.report
        if isinstance(report, WorkerReady):
            self.pid = report.pid or self.pid
            self.node_id, self.data_address = reply.node_id, report.data_address
            log.info(
                "group %r: worker pid %d %s, Ray actor %s%s",
                self.group,
                self.pid,
                where,
                self.name,
                f", data plane also at {self.data_address}" if self.data_address else "",
            )
            if self._on_ready is not None:  # before READY: peers learn where it is before a request can go there
                self._on_ready(self)
            return Handshake(
                pid=self.pid,
                fraction_enforced=report.fraction_enforced,
                physical_gpu=report.physical_gpu,
                device=report.device,
                voices=report.voices,
                max_text_chars=report.max_text_chars,
                host=reply.hostname,
                node_id=reply.node_id,
                data_address=self.data_address,
            )
        if isinstance(report, WorkerFailed):
            raise WorkerStartError(self.group, report.message, stage=report.stage, traceback=report.traceback)
        if reply.timed_out:
            raise WorkerStartError(
                self.group, f"worker pid {self.pid} {where} did not report READY within {timeout:g}s"
            )
        raise WorkerStartError(
            self.group,
            f"worker pid {self.pid} {where} died during initialization "
            f"({describe_exit(reply.exitcode)}); see its output in the daemon log",
        )

    async def _placed(self, first_call: Coroutine[Any, Any, R], timeout: float, deadline: float) -> R:
        """The answer to the actor's first call, which comes once Ray placed the actor.

        An actor Ray cannot place waits forever: say so at once when no alive node could ever take it,
        and give up at `deadline` (the start timeout, `timeout` seconds) when the nodes that fit stay busy.
        """
        loop = asyncio.get_running_loop()
        scheduled = asyncio.ensure_future(first_call)
        try:
            while True:
                await asyncio.wait({scheduled}, timeout=1.0)
                if scheduled.done():
                    return scheduled.result()
                lacks = await asyncio.to_thread(self._lacks)
                if lacks:
                    raise WorkerStartError(
                        self.group, f"Ray cannot place the worker of {self.group!r} (CLUSTER_LACKS): {'; '.join(lacks)}"
                    )
                if loop.time() > deadline:
                    raise WorkerStartError(
                        self.group,
                        f"Ray did not place the worker of {self.group!r} within "
                        f"{timeout:g}s: the nodes that fit it are busy (see `ray status`)",
                    )
        finally:
            scheduled.cancel()

    async def _launch_rank(self, devices: dict[str, str], deadline: float) -> int:
        """A TP rank: wait for every rank of its stage on its node, then start its worker seeing their GPUs."""
        assert self.tp is not None, "a TP rank's worker has its gang"
        gang, rank = self.tp
        node = devices.get("node_id", "")
        try:
            visible = await gang.gather(
                rank, node, devices.get("visible", ""), max(0.0, deadline - asyncio.get_running_loop().time())
            )
        except asyncio.TimeoutError:
            raise WorkerStartError(
                self.group,
                f"TP rank {rank} of stage {gang.stage!r} waited in vain for ranks "
                f"{gang.missing(node)} to be placed on its node {node[:12]} (placement group "
                f"{gang.name}, see `ray status`)",
            ) from None
        return await self._call_within(REPLY_GRACE, self.actor.launch, visible)

    async def wait_exit(self) -> int | None:
        """The worker's exit status; None when its actor died with it (killed, or its node went away)."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._await_exit())
        return await asyncio.shield(self._exit)

    async def _await_exit(self) -> int | None:
        try:
            self._code = await self._call(self.actor.wait_exit)
        except self._ray.exceptions.RayError as error:
            log.error("group %r: Ray actor %s is gone: %s", self.group, self.name, _first_line(error))
            self._code = None
        return self._code

    async def unresponsive(self) -> str:
        silence = await self._silence(self.heartbeat_timeout)
        return describe_unresponsive(self.pid, self.group, silence, self.host)

    async def silent(self) -> str:
        silence = await self._silence(silence_limit(self.heartbeat_timeout))
        return describe_silence(self.pid, self.group, silence, self.host)

    async def _silence(self, seconds: float) -> float:
        """The silence once the host saw no heartbeat for `seconds`; never when that is 0 (heartbeats off), nor
        once the worker exited or its actor is gone (wait_exit tells the story)."""
        if seconds > 0:
            try:
                silence = await self._call(self.actor.unresponsive, seconds)
            except self._ray.exceptions.RayError:
                silence = None
            if silence is not None:
                return float(silence)
        never: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        return await never

    async def beating(self) -> None:
        if self.heartbeat_timeout <= 0:
            await asyncio.Future()
        try:
            beat = await self._call(self.actor.next_beat)
        except self._ray.exceptions.RayError:
            beat = False
        if not beat:  # it exited, or its actor is gone: wait_exit tells the story
            await asyncio.Future()

    def exitcode(self) -> int | None:
        return self._code

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the worker; its actor goes too, so an actor Ray never placed (or a wedged one) ends as well."""
        self._signal(signal.SIGKILL)
        self._ray.kill(self.actor, no_restart=True)

    def _signal(self, signum: int) -> None:
        try:
            self.actor.signal.remote(signum)
        except self._ray.exceptions.RayError:
            pass  # the actor is gone, and its worker with it

    def close(self) -> None:
        """End the actor (its worker has exited): Ray frees its resources and its name."""
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self._exit is not None and not self._exit.done():
            self._exit.cancel()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
        except StagevisorError as error:
            raise DaemonError(f"{error.code.value}: {error.message}") from None
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
            on_ready=self._announce,
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

    def _announce(self, worker: RayWorker) -> None:
        """A worker is READY: tell the gateway and every READY worker (it too) where it runs."""
        for address, other in list(self.live.items()):  # workers that exited since hear nothing more
            if other._code is not None or (other._exit is not None and other._exit.done()):
                del self.live[address]
        self.live[worker.address] = worker
        if self.gateway is not None:
            self.gateway.push_peers({worker.address: Peer(worker.node_id, worker.data_address)}, list(self.live))


def _lacks_one(plan: Plan, group: str, nodes: Sequence[ClusterNode]) -> list[str]:
    """What the alive nodes lack for one group (its node resource, its GPU share)."""
    return cluster_lacks(replace(plan, groups=tuple(g for g in plan.groups if g.name == group)), nodes)
