"""How the daemon makes its workers: each WorkerSpec of a Plan with the daemon's options, at the address each
single-worker group's worker uses now, and the WorkerRunner of a spec with the daemon's backoff and timeouts.

The daemon (core.py) holds one WorkerFactory and asks it whenever a start, a scale, a restart beside a worker or an
apply needs specs or runners. What an apply changes under it, the current topology's run directory and gateway, it
reads through FactoryHost; the daemon hands each runner its launcher and hooks. specs.py says what a spec holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.daemon.lifecycle import BackoffPolicy
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.replicas import replica_drain_timeout
from stagevisor.supervisor.daemon.runner import RunnerHooks, WorkerRunner
from stagevisor.supervisor.daemon.seams import DaemonGateway
from stagevisor.supervisor.daemon.specs import stop_window, worker_specs
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.worker.spec import WorkerSpec


class FactoryHost(Protocol):
    """What the factory reads from the daemon as it is now (an apply changes the run directory and the gateway)."""

    options: DaemonOptions
    pid: int

    @property
    def generation_dir(self) -> Path:
        """The current topology's run directory: where specs put their sockets unless told another."""

    @property
    def gateway(self) -> DaemonGateway:
        """The current gateway: its shared-memory directory goes in each spec unless another gateway is named."""


class WorkerFactory:
    """Makes the daemon's WorkerSpecs and WorkerRunners, and keeps which groups' workers run at their alternate
    address."""

    def __init__(self, host: FactoryHost) -> None:
        self.host = host
        self.alternate: set[str] = set()
        """Groups whose single worker runs at its alternate address (worker_address): a restart without a pause
        moved it there; the next one moves it back. An apply's new topology starts with none."""

    def specs(
        self,
        plan: Plan,
        run_dir: Path | None = None,
        alternate: frozenset[str] | None = None,
        gateway: DaemonGateway | None = None,
    ) -> tuple[dict[str, WorkerSpec], str]:
        """The specs of `plan` in `run_dir` (default: the current topology's, with its alternate addresses), for
        the workers of `gateway` (default: the daemon's)."""
        host = self.host
        if alternate is None:
            alternate = frozenset(self.alternate) if run_dir is None else frozenset()
        return worker_specs(
            plan,
            run_dir or host.generation_dir,
            alternate=alternate,
            parent_pid=host.pid,
            log_level=host.options.log_level,
            import_paths=host.options.import_paths,
            metrics=host.options.metrics,
            drain_timeout=self.drain_timeout,
            stop_timeout=host.options.stop_timeout,
            # Set where every path's specs are made (start, a restart beside, scale, apply), so none leaves it out.
            record_handoffs=host.options.record_handoffs,
            # Workers map and write large payloads in the gateway's private shared-memory directory.
            shm_dir=(gateway or host.gateway).shm_dir,
        )

    def spec_beside(self, plan: Plan, name: str) -> WorkerSpec:
        """The spec of a new worker of `plan`'s single-worker group `name` at the address its worker does not use."""
        return self.specs(plan, alternate=frozenset(self.alternate ^ {name}))[0][name]

    def runner(self, spec: WorkerSpec, launcher: DaemonLauncher, hooks: RunnerHooks) -> WorkerRunner:
        """A runner of `spec`'s worker, started through `launcher` and reporting through `hooks`."""
        options = self.host.options
        return WorkerRunner(
            spec,
            launcher,
            BackoffPolicy(
                max_restarts=options.max_restarts,
                initial=options.backoff_initial,
                max_delay=options.backoff_max,
            ),
            hooks,
            start_timeout=options.start_timeout,
            stop_timeout=self.stop_timeout(spec),
        )

    def stop_timeout(self, spec: WorkerSpec) -> float:
        """How long a runner waits for `spec`'s worker to exit once signalled: a replica's worker drains what it
        holds (up to drain_timeout) before it exits on SIGTERM. Its spec says the same to the worker."""
        return stop_window(self.host.options.stop_timeout, spec.drain_grace)

    @property
    def drain_timeout(self) -> float:
        """How long a replica taken out of rotation (rolling restart, scale-down) may finish its requests: as
        long as a request may run (`replica_drain_timeout`), not only --drain-timeout (that bounds shutdown)."""
        options = self.host.options
        return replica_drain_timeout(options.drain_timeout, options.request_limits.request_timeout)
