"""The worker's one message to the daemon at start: READY (what it runs on) or FAILED (the root cause).

Both sides use these classes: the worker sends one over its handshake pipe
(pickled by multiprocessing), the daemon's launchers read it; under Ray the
host actor relays it with the node it ran on (cluster/host.py). A standby
worker first gets the daemon's one message to it, an Activation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Union

from stagevisor.supervisor.worker.spec import WorkerSpec


@dataclass(frozen=True)
class WorkerReady:
    """The worker built its stages and serves its data-plane address."""

    pid: int
    fraction_enforced: bool
    """Whether the group's GPU memory fraction is applied (torch's per-process limit)."""
    physical_gpu: str | None = None
    """The device its CUDA_VISIBLE_DEVICES names (None: not isolated, or a CPU group)."""
    device: str = ""
    """Where its GPU stages run: `cuda:0 (<name>, <uuid>)`, or `cpu`; empty for a CPU group."""
    voices: tuple[dict[str, Any], ...] = ()
    """The voices its stages declare (their `voices` attribute)."""
    max_text_chars: int | None = None
    """The smallest `max_text_chars` its executors declare, None when none does."""
    data_address: str = ""
    """host:port it also listens on for peers on other nodes (--launcher ray); empty: none."""
    stamps: Mapping[str, float] = field(default_factory=dict)
    """Wall-clock instants of its start (`entered`, `imported`, `built`, `bound`, `activated`), and the
    durations `factory_import_seconds` and `cpu_seconds` (process_worker.startup_phases reads them)."""


@dataclass(frozen=True)
class WorkerFailed:
    """The worker could not start: the message, the stage that failed (empty: not a stage) and its traceback."""

    message: str
    stage: str = ""
    traceback: str = ""


WorkerReport = Union[WorkerReady, WorkerFailed]
"""What a worker sends on its handshake pipe, once."""


@dataclass(frozen=True)
class Activation:
    """The daemon tells a standby worker (--standby-worker) to take over, and where it serves.

    A standby is built for its group's worker at one address; a restart without a pause starts the new
    worker at the group's other address (daemon/specs.py's worker_address), with routing to match. Those are
    the only fields of its spec an activation changes (none is read before it serves): the stages it built
    stay as they are.
    """

    address: str
    replica_routes: Mapping[str, tuple[str, ...]]
    address_gpus: Mapping[str, int | None]

    @classmethod
    def of(cls, spec: WorkerSpec) -> Activation:
        """The activation that makes a standby built for a spec like `spec` serve as `spec` says."""
        return cls(spec.address, dict(spec.replica_routes), dict(spec.address_gpus))

    def apply(self, spec: WorkerSpec) -> WorkerSpec:
        """The spec a standby built from `spec` serves as once activated."""
        return replace(
            spec,
            address=self.address,
            replica_routes=dict(self.replica_routes),
            address_gpus=dict(self.address_gpus),
        )
