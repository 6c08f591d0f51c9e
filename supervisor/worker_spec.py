"""WorkerSpec: the picklable blueprint a spawned worker process is started from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from stagevisor.supervisor.plan import PlannedStage, ProcessGroup


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
