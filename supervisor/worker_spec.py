"""WorkerSpec: the picklable blueprint a spawned worker process is started from, and its device environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from stagevisor.supervisor.plan import PlannedStage, ProcessGroup

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = "CUDA_DEVICE_ORDER"
ISOLATION_SWITCH = "STAGEVISOR_GPU_ISOLATION"
"""Set to 0 in the daemon's environment to leave CUDA_VISIBLE_DEVICES of the workers alone."""


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
    parent_pid: int = 0
    """The daemon's pid; the worker exits when it is gone."""
    log_level: str = "INFO"
    import_paths: tuple[str, ...] = ()
    """Directories put first on sys.path before any factory is imported (supervisor/app_paths.py)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the worker process starts with, on top of the daemon's (see `device_environment`)."""
    address_gpus: Mapping[str, int | None] = field(default_factory=dict)
    """Data-plane address -> the placement GPU of the worker serving it (None: CPU group or the daemon).
    Two workers with the same GPU id run on the same physical device, so CUDA tensors can pass by IPC."""

    @property
    def isolated(self) -> bool:
        """True when the worker sees only its group's GPU, as CUDA device 0."""
        return VISIBLE_DEVICES in self.env


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


def device_environment(gpu: int | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The CUDA variables of a worker: its own GPU only, or none for a CPU group.

    Set before the worker's interpreter starts, so every library in it (torch,
    onnxruntime's CUDA provider, an engine's own allocator) sees one device,
    CUDA device 0, and cannot touch the GPUs of other groups. A CPU group sees
    no GPU at all. Device indices follow PCI bus order, as nvidia-smi numbers
    them, unless the daemon's environment chose an order.
    """
    if environ.get(ISOLATION_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return {}
    env = {DEVICE_ORDER: environ.get(DEVICE_ORDER, "PCI_BUS_ID")}
    # An empty CUDA_VISIBLE_DEVICES hides every device: a GPU id the daemon
    # cannot see leaves the worker to its documented CPU fallback.
    env[VISIBLE_DEVICES] = "" if gpu is None else (physical_gpu(gpu, environ) or "")
    return env
