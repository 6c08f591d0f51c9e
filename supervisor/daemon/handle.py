"""How the daemon sees a worker process: the WorkerHandle and launcher Protocols, and the Handshake a worker reports.

Everything above the launchers (daemon, lifecycle) sees a WorkerHandle and
never touches multiprocessing, signals or file descriptors, so tests replace
the launcher with a fake. Implemented by the local launcher (launcher.py,
whose workers are process_worker.py's ProcessWorker) and the Ray launcher
(cluster/launcher.py, whose workers are cluster/worker.py's RayWorker).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from stagevisor.supervisor.dataplane.client_failures import PROCESS_STOPPED
from stagevisor.supervisor.worker.spec import WorkerSpec


@dataclass(frozen=True)
class Handshake:
    """What a worker reports once its stages are built and its data-plane endpoint serves."""

    pid: int
    fraction_enforced: bool
    physical_gpu: str | None = None
    """The device the worker's CUDA_VISIBLE_DEVICES names (None: not isolated, or a CPU group)."""
    device: str = ""
    """Where its GPU stages run: `cuda:0 (<name>, <uuid>)`, or `cpu`; empty for a CPU group."""
    voices: tuple[dict[str, Any], ...] = ()
    """The voices the group's stages declare (their `voices` attribute), for GET /v1/audio/voices."""
    max_text_chars: int | None = None
    """The smallest `max_text_chars` the group's executors declare (stages/base.py), None when none does."""
    host: str = ""
    """The host the worker runs on (a Ray node's, under `--launcher ray`)."""
    node_id: str = ""
    """The cluster node it runs on, as its launcher names it (a Ray node id); empty for the local launcher."""
    data_address: str = ""
    """host:port it also listens on for data-plane peers on other nodes (--launcher ray); empty: none."""
    phases: tuple[tuple[str, float], ...] = ()
    """Where the start went, in order: (phase, seconds) as `startup_phases` names them; empty if unknown."""
    cpu_seconds: float | None = None
    """CPU time the worker process had used when it sent READY (all its threads); None if unknown."""

    def describe_phases(self) -> str:
        """`started in 0.41s: launch 0.004s, ..., handshake 0.001s; worker cpu 0.350s`; empty without phases.

        Far more wall time than worker CPU time means the machine was busy, not the worker.
        """
        if not self.phases:
            return ""
        total = sum(seconds for _, seconds in self.phases)
        text = f"started in {total:.3f}s: " + ", ".join(f"{name} {seconds:.3f}s" for name, seconds in self.phases)
        return text if self.cpu_seconds is None else f"{text}; worker cpu {self.cpu_seconds:.3f}s"


def describe_exit(code: int | None) -> str:
    """An exit status in words: `exit code 3`, `killed by SIGKILL`."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def heartbeat_interval(timeout: float) -> float:
    """How often a worker beats for a given timeout: four beats per timeout, at least one a second; 0: off."""
    return 0.0 if timeout <= 0 else min(1.0, timeout / 4)


SILENT_BEATS = 3
"""Heartbeats a worker may miss before it counts as silent: a replica that is, takes no new requests."""


def silence_limit(timeout: float) -> float:
    """Seconds without a heartbeat after which a worker is silent (3 beats: 3 s for the default 10 s timeout,
    at most three quarters of the timeout); 0: heartbeats are off."""
    return SILENT_BEATS * heartbeat_interval(timeout)


def describe_silence(pid: int, group: str, seconds: float, host: str = "") -> str:
    """Why a worker counts as silent, in words (the runner adds what follows from it)."""
    where = f" on host {host}" if host else ""
    return f"worker pid {pid} of group {group!r}{where} sent no heartbeat for {seconds:.3g}s"


def describe_unresponsive(pid: int, group: str, seconds: float, host: str = "", *, stopped: bool = False) -> str:
    """Why a worker is taken for wedged, in words (the runner kills it); `stopped`: the kernel says its process is
    stopped (a worker of this host), so its event loop is not to blame."""
    where = f" on host {host}" if host else ""
    why = (
        PROCESS_STOPPED
        if stopped
        else "its event loop is blocked (a synchronous call in a stage's process()) or the process is stopped"
    )
    return f"worker pid {pid} of group {group!r}{where} did not answer its heartbeat for {seconds:.3g}s: {why}"


class WorkerHandle(Protocol):
    """Runtime handle of one worker process (the blueprint is its WorkerSpec)."""

    pid: int

    async def handshake(self, timeout: float) -> Handshake: ...
    async def wait_exit(self) -> int | None:
        """Return the exit code once the process ends; any number of callers may wait at once."""

    async def unresponsive(self) -> str:
        """Return, with the reason in words, once the worker's event loop stops answering its heartbeat.

        Never returns while the worker beats, or when heartbeats are off.
        """

    async def silent(self) -> str:
        """Return, with the reason in words, once the worker missed SILENT_BEATS heartbeats in a row (well before
        `unresponsive`). Never returns while it beats, once it exited, or when heartbeats are off."""

    async def beating(self) -> None:
        """Return at the worker's next heartbeat; never once it exited, or when heartbeats are off."""

    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


class WorkerLauncher(Protocol):
    """Starts the worker of one process group; a runner's only way to create processes."""

    def start(self, spec: WorkerSpec) -> WorkerHandle: ...


class DaemonLauncher(WorkerLauncher, Protocol):
    """The launcher as the daemon holds it: made ready before the first start, closed after the last stop."""

    async def prepare(self) -> None:
        """Get ready to start workers (a fork server's preload, joining a cluster), off the event loop."""

    def adopt(self, specs: Mapping[str, WorkerSpec]) -> None:
        """The daemon runs these workers from now on, each READY (after a scale or an apply): release what the
        launcher keeps for workers no longer run, and keep it for these (standby workers)."""

    async def close(self) -> None:
        """Release what the launcher holds besides the workers (standby workers); idempotent."""
