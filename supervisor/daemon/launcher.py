"""The local launcher: starts worker processes (forked from the fork server, or spawned) and keeps standby workers.

The daemon's way to create processes (the WorkerLauncher seam of handle.py):
each worker it starts is a ProcessWorker (process_worker.py); what it decides
without side effects (fork or spawn, the preload, which groups keep a
standby) is start_policy.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import sys
import time
from typing import Any, Collection, Iterable, Iterator, Mapping

from stagevisor.supervisor.daemon.handle import describe_exit, heartbeat_interval
from stagevisor.supervisor.daemon.process_worker import ProcessWorker
from stagevisor.supervisor.daemon.start_policy import (
    FORK_SERVER_MODULE,
    WORKER_PRELOAD,
    can_take_over,
    forks_from_server,
    main_module_preload,
)
from stagevisor.supervisor.worker.fork_server import start_environment as fork_server_environment
from stagevisor.supervisor.worker.spec import WorkerSpec, device_environment

log = logging.getLogger("stagevisor.daemon")


@contextlib.contextmanager
def child_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set `env` in this process for the duration of a spawn, then restore what was there.

    A spawned child inherits the environment at `Process.start()`, before its
    interpreter runs a line: the only way to have CUDA_VISIBLE_DEVICES in place
    before any library in it could initialize CUDA, and to have it show in
    /proc/PID/environ. Called on the daemon's main thread, which is the only one
    that starts workers.
    """
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


START_METHODS = ("forkserver", "spawn")
"""How workers start: forked from a preloaded fork server (fast restarts), or each a fresh interpreter."""

STANDBY_STOP_GRACE = 2.0
"""Seconds a discarded standby worker has to exit after SIGTERM before SIGKILL (it serves nothing)."""


def _ready_probe() -> None:
    """Target of the process `Launcher.prepare` forks to know the fork server is up; does nothing."""


class Launcher:
    """Starts worker processes, never by a bare fork of the daemon (gRPC and CUDA are not fork-safe).

    `forkserver` (the default): multiprocessing's fork server, a process
    started once from a fresh interpreter, imports `preload` (see
    `preload_modules`) and forks each worker from there, so a restarted
    worker skips the interpreter start and those imports. The daemon itself
    never forks. The server exits when the daemon does (it reads EOF on a
    pipe from the daemon), and its workers then die of PR_SET_PDEATHSIG; the
    lifeline covers the rest. `spawn`: every worker is a fresh interpreter.

    Call `start` from the daemon's main thread: with spawn, PR_SET_PDEATHSIG in
    the child fires when the *thread* that created it exits.

    `standby`: groups (CPU only, see `standby_groups`) that keep one standby
    worker besides their worker, started once that worker is READY. A standby
    builds its stages, then waits without binding anything; when the group
    needs a new worker (a crash, after its backoff, or an operator restart),
    `start` activates the standby instead of starting a process, so READY is
    a bind and a handshake away. It costs a second worker's memory per group.
    Call `close` at shutdown: it stops the standbys.
    """

    def __init__(
        self,
        method: str = "forkserver",
        *,
        preload: Iterable[str] = WORKER_PRELOAD,
        heartbeat_timeout: float = 0.0,
        standby: Collection[str] = (),
        forks: bool = True,
    ) -> None:
        if method not in START_METHODS:
            raise ValueError(f"worker start method must be one of {', '.join(START_METHODS)}, got {method!r}")
        if heartbeat_timeout < 0:
            raise ValueError(f"heartbeat timeout must be >= 0 seconds (0: off), got {heartbeat_timeout:g}")
        self.method = method
        self.forks = forks
        """Whether any worker will fork from the fork server (a CPU group); False: `prepare` does not start it."""
        self.heartbeat_timeout = heartbeat_timeout
        self.standby = frozenset(standby)
        self._standbys: dict[str, ProcessWorker] = {}
        self._discarded: set[asyncio.Task[None]] = set()
        self._closed = False
        # Any: typeshed gives get_context(str) a BaseContext, which lacks Process; spawn and forkserver have it.
        self._context: Any = multiprocessing.get_context(method)
        if method == "forkserver":
            # Process-wide in multiprocessing: one fork server per daemon.
            main_modules = main_module_preload(sys.modules.get("__main__"))
            modules = [FORK_SERVER_MODULE, *preload, *(m for m in main_modules if m not in preload)]
            self._context.set_forkserver_preload(modules)

    async def prepare(self) -> None:
        """Start the fork server and wait until it has preloaded, off the event loop.

        Otherwise the first `start` would block the daemon's loop (and its admin
        API) for as long as the imports take. No-op for spawn, and where no
        worker forks from it (`forks` False: every group has a GPU stage, and GPU
        groups are spawned): its preload would be a fresh interpreter's imports
        for nothing, ahead of every worker's start.
        """
        if self.method == "forkserver" and self.forks:
            began = time.monotonic()
            log.info("loading: the workers' modules, once, in the fork server")
            await asyncio.to_thread(self._warm)
            log.info("loaded in %.1fs", time.monotonic() - began)

    def _warm(self) -> None:
        probe = self._context.Process(target=_ready_probe, name="stagevisor-forkserver-probe", daemon=True)
        # The fork server, and so every worker forked from it, starts with no GPU visible:
        # CPU groups fork from it; GPU groups are spawned with their own device (see start).
        environment = {**device_environment((), os.environ), **fork_server_environment(os.environ, sys.path)}
        with child_environment(environment):
            probe.start()  # returns once the fork server, done preloading, has forked the probe
        probe.join()
        probe.close()

    def start(self, spec: WorkerSpec) -> ProcessWorker:
        """A new worker for the group: its standby activated when one is alive, else a new process."""
        name = spec.name  # each replica of a group keeps its own standby
        worker = self._standbys.pop(name, None)
        if worker is not None and not (
            can_take_over(worker.spec, spec) and worker.process.exitcode is None and worker.activate(spec)
        ):
            code = worker.process.exitcode
            log.warning(
                "worker %r: standby worker pid %d %s; starting a new worker",
                name,
                worker.pid,
                "no longer matches the group" if code is None else f"had exited ({describe_exit(code)})",
            )
            self._discard(worker)
            worker = None
        if worker is None:
            worker = self._launch(spec)
        if spec.group.name in self.standby and forks_from_server(spec):
            worker.on_ready = lambda: self._prepare_standby(spec)
        return worker

    def adopt(self, specs: Mapping[str, WorkerSpec]) -> None:
        """The daemon runs these workers from now on, each READY (a scale or an apply changed them).

        A standby kept for a worker no longer run (a replica scaled away, or renamed: `pipeline/0` is `pipeline`
        again after a scale to one), or for one it cannot take over, is stopped; a worker of a standby group that
        has no standby gets one, as a worker does when it becomes READY.
        """
        for name, standby in list(self._standbys.items()):
            spec = specs.get(name)
            if spec is None or not can_take_over(standby.spec, spec):
                del self._standbys[name]
                log.info(
                    "worker %r: standby worker pid %d stopped: %s",
                    name,
                    standby.pid,
                    "the daemon no longer runs that worker" if spec is None else "it no longer matches the worker",
                )
                self._discard(standby)
        for spec in specs.values():
            if spec.group.name in self.standby and forks_from_server(spec):
                self._prepare_standby(spec)

    def _prepare_standby(self, spec: WorkerSpec) -> None:
        """Start the group's next standby worker (its worker just became READY), unless one exists."""
        name = spec.name
        if self._closed or name in self._standbys:
            return
        self._standbys[name] = self._launch(spec, standby=True)
        log.info("worker %r: standby worker pid %d started", name, self._standbys[name].pid)

    def _discard(self, worker: ProcessWorker) -> None:
        """Stop a standby worker that will not be used, and reap it in the background."""
        task = asyncio.get_running_loop().create_task(self._stop_standby(worker))
        self._discarded.add(task)
        task.add_done_callback(self._discarded.discard)

    @staticmethod
    async def _stop_standby(worker: ProcessWorker) -> None:
        worker.terminate()
        try:
            await asyncio.wait_for(worker.wait_exit(), STANDBY_STOP_GRACE)
        except asyncio.TimeoutError:
            worker.kill()
            try:
                await asyncio.wait_for(worker.wait_exit(), 10.0)
            except asyncio.TimeoutError:
                log.error("standby worker pid %d of group %r survived SIGKILL for 10s", worker.pid, worker.group)
                return
        worker.close()

    async def close(self) -> None:
        """Stop every standby worker and start no more (daemon shutdown). Idempotent."""
        self._closed = True
        standbys, self._standbys = list(self._standbys.values()), {}
        for worker in standbys:
            self._discard(worker)
        await asyncio.gather(*self._discarded, return_exceptions=True)

    def _launch(self, spec: WorkerSpec, *, standby: bool = False) -> ProcessWorker:
        from stagevisor.supervisor.worker import boot as worker_boot

        context = self._context if forks_from_server(spec) else multiprocessing.get_context("spawn")
        handshake_read, handshake_write = context.Pipe(duplex=False)
        # Duplex: a socket pair, so heartbeats travel back on the lifeline.
        lifeline_daemon, lifeline_worker = context.Pipe(duplex=True)
        activation_read, activation_write = context.Pipe(duplex=False) if standby else (None, None)
        process = context.Process(
            target=worker_boot.main,
            args=(spec, handshake_write, lifeline_worker, heartbeat_interval(self.heartbeat_timeout), activation_read),
            name=f"stagevisor-worker-{spec.name}",
            daemon=False,
        )
        try:
            # A spawned child takes the environment at start(); a forked one already has the fork
            # server's, which hides every GPU (see _warm): worker.main applies spec.env again.
            launch_begin = time.time()
            # A fork server that died (see _warm) is started again by this start(): with its own environment too.
            forked = self.method == "forkserver" and forks_from_server(spec)
            server = fork_server_environment(os.environ, sys.path) if forked else {}
            with child_environment({**server, **spec.env}):
                process.start()
            launched = time.time()
        except BaseException:
            for conn in (handshake_read, lifeline_daemon, activation_write):
                if conn is not None:
                    conn.close()
            raise
        finally:
            # Drop the parent's copies of the child's ends so EOF means the child is gone.
            for conn in (handshake_write, lifeline_worker, activation_read):
                if conn is not None:
                    conn.close()
        worker = ProcessWorker(
            spec.name,
            process,
            handshake_read,
            lifeline_daemon,
            heartbeat_timeout=self.heartbeat_timeout,
            activation=activation_write,
        )
        worker.launch_begin, worker.launched = launch_begin, launched
        worker.spec = spec
        return worker
