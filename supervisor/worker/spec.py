"""WorkerSpec: the picklable blueprint a spawned worker process is started from, and its device environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from stagevisor.supervisor import envs
from stagevisor.supervisor.plan import PlannedStage, ProcessGroup

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = "CUDA_DEVICE_ORDER"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs: its group, its stages, and where every other stage lives.

    Data-plane addresses are gRPC targets (`unix:/path/to.sock` in practice).
    """

    group: ProcessGroup
    stages: tuple[PlannedStage, ...]
    """This group's stages, in config order (the order they are built in)."""
    model_path: str | None
    address: str
    """Where this worker serves its data-plane endpoint."""
    routes: Mapping[str, str] = field(default_factory=dict)
    """Stage name -> data-plane address of the worker that receives its requests (rank 0 for TP)."""
    sink_address: str = ""
    """The daemon's data-plane endpoint: terminal stages' chunks, results and errors go there."""
    shm_dir: str = ""
    """The daemon's private shared-memory directory; when it is missing, large payloads go inline."""
    parent_pid: int = 0
    """The daemon's pid. A worker's parent is the daemon or its fork server; it exits when the daemon is gone
    (PR_SET_PDEATHSIG on its parent, EOF on its lifeline)."""
    log_level: str = "INFO"
    metrics: bool = False
    """Measure stages and handoffs and report them to the daemon (supervisor/metrics/recorder.py)."""
    import_paths: tuple[str, ...] = ()
    """Directories put first on sys.path before any factory is imported (supervisor/worker/app_paths.py)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the worker process starts with, on top of the daemon's (see `device_environment`)."""
    address_gpus: Mapping[str, int | None] = field(default_factory=dict)
    """Data-plane address -> the placement GPU of the worker serving it (None: CPU group or the daemon).
    Two workers with the same GPU id run on the same physical device, so CUDA tensors can pass by IPC."""
    cache_dir: str = ""
    """A private directory for derived files executors may reuse across restarts (optimized graphs);
    exported to the worker's stages as $STAGEVISOR_CACHE_DIR. Empty: none."""
    record_handoffs: str = ""
    """`stagevisor check --verify-edges` only: a private directory where the worker records, in comparable
    form, every payload its stages receive along an edge (supervisor/worker/handoffs.py). Empty: nothing recorded."""
    worker: str = ""
    """The worker's name: `group/index` for a replica of a replicated group; empty: the group's name."""
    replica_routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Replicated group address (as in `routes`) -> its replicas' addresses; empty when no group is replicated.
    Senders pick among them per request (supervisor/dataplane/replicas.py); the daemon pushes changes."""
    drain_grace: float = 0.0
    """Seconds a stopping worker waits for the requests it holds (0: worker.STOP_GRACE). Replicas get
    the daemon's drain timeout: they are stopped while the pipeline serves (rolling restart, scale down)."""
    stop_timeout: float | None = None
    """Seconds the daemon waits for this worker to exit after SIGTERM before it sends SIGKILL (its --stop-timeout,
    plus drain_grace): the worker ends its drain in time to exit within them (worker.main.drain_budget). None: no
    daemon waits on it with a deadline; it drains for its whole grace."""

    node_id: str = ""
    """The Ray node it runs on (set by its actor under --launcher ray); empty with the local launcher."""
    node_ip: str = ""
    """That node's IP (set by its actor): the worker also listens on TCP there, for peers on other nodes."""
    peers: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Data-plane address -> (Ray node id, host:port) of the sink and each READY worker when this one started;
    the daemon pushes changes (supervisor/dataplane/peers.py). Empty with the local launcher."""
    dataplane_token: str = field(default="", repr=False)
    """The bearer token every data-plane listener checks under --launcher ray (one per daemon run)."""
    dataplane_tls: tuple[bytes, bytes] | None = field(default=None, repr=False)
    """(certificate, key) PEM of this run's data-plane TLS across nodes; None: plaintext."""

    @property
    def name(self) -> str:
        """What logs, events, metrics and `stagevisor status` call this worker."""
        return self.worker or self.group.name

    @property
    def isolated(self) -> bool:
        """True when the worker sees only its group's GPU (as CUDA device 0; `tp_rank` for a TP rank)."""
        return VISIBLE_DEVICES in self.env

    @property
    def local_gpu(self) -> int | None:
        """The CUDA index of the group's GPU inside its worker; None for a CPU group.

        Under isolation: 0, or the rank for a TP rank (it sees its stage's GPUs
        in rank order). Without: the placement GPU id.
        """
        if self.group.gpu is None:
            return None
        if not self.isolated:
            return self.group.gpu
        return self.group.tp_rank if self.group.tp_size > 1 and self.group.tp_rank is not None else 0


def physical_gpu(gpu: int, environ: Mapping[str, str]) -> str | None:
    """The device the daemon calls `gpu`, as CUDA_VISIBLE_DEVICES names it: an index, a GPU-/MIG- UUID.

    Placement GPU ids count the devices the daemon itself sees: with the daemon
    under CUDA_VISIBLE_DEVICES=2,3, GPU 1 is physical device 3. None when the
    daemon sees no such device.
    """
    visible = environ.get(VISIBLE_DEVICES)
    if visible is None:
        return str(gpu)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    return entries[gpu] if gpu < len(entries) else None


def group_gpus(group: ProcessGroup, stages: Sequence[PlannedStage]) -> tuple[int, ...]:
    """The placement GPUs a group's worker must see: its own; every rank's for a TP rank; none on CPU.

    A TP rank sees all of its stage's GPUs, in rank order, so the ranks can
    reach each other's memory peer to peer (NCCL, custom all-reduce); its own
    GPU is then CUDA device `tp_rank`.
    """
    if group.gpu is None:
        return ()
    if group.tp_size > 1:
        for stage in stages:
            if isinstance(stage.gpu, tuple) and len(stage.gpu) == group.tp_size:
                return stage.gpu
    return (group.gpu,)


def device_environment(gpus: Sequence[int], environ: Mapping[str, str]) -> dict[str, str]:
    """The CUDA variables of a worker: only the GPUs of `group_gpus`, none for a CPU group.

    Set before the worker's interpreter starts, so every library in it (torch,
    onnxruntime's CUDA provider, an engine's own allocator) sees only those
    devices and cannot touch the GPUs of other groups. Device indices follow
    PCI bus order, as nvidia-smi numbers them, unless the daemon's environment
    chose an order.
    """
    if envs.GPU_ISOLATION.switched_off(environ):
        return {}
    env = {DEVICE_ORDER: environ.get(DEVICE_ORDER, "PCI_BUS_ID")}
    physical = [physical_gpu(gpu, environ) for gpu in gpus]
    # An empty CUDA_VISIBLE_DEVICES hides every device: a GPU id the daemon
    # cannot see leaves the worker to its documented CPU fallback.
    env[VISIBLE_DEVICES] = "" if None in physical else ",".join(p for p in physical if p is not None)
    return env
