"""The daemon's one OS seam: start a worker process, read its handshake, hear its heartbeat, signal it, await its exit.

Everything above this module (daemon, lifecycle) sees a WorkerHandle and
never touches multiprocessing, signals or file descriptors, so tests replace
Launcher with a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Protocol

from stagevisor.supervisor.errors import DaemonError, WorkerStartError
from stagevisor.supervisor.worker.fork_server import start_environment as fork_server_environment
from stagevisor.supervisor.worker.handshake import Activation, WorkerFailed, WorkerReady
from stagevisor.supervisor.worker.spec import WorkerSpec, device_environment

log = logging.getLogger("stagevisor.daemon")


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


STARTUP_PHASES = ("launch", "interpreter", "imports", "build", "serve", "handshake")
"""A worker's start, in order (see `startup_phases`)."""
STANDBY_PHASES = ("standby activation", "serve", "handshake")
"""A standby worker's start, which built its stages before it was needed (see `startup_phases`)."""


def startup_phases(
    launch_begin: float, launched: float, stamps: Mapping[str, float], received: float
) -> tuple[tuple[str, float], ...]:
    """Split a worker's start into STARTUP_PHASES from wall-clock instants. Pure.

    - launch: the daemon's `Process.start()` (a round trip to the fork server, or fork+exec);
    - interpreter: until worker_boot.main runs (a fresh interpreter and multiprocessing's bootstrap
      when spawned; unpickling the WorkerSpec either way);
    - imports: the worker's own modules and the stages' factory modules;
    - build: binding the GPU and calling the factories (loading models);
    - serve: binding and starting the data-plane server;
    - handshake: from the server started to READY read by the daemon (composing and sending it).

    `stamps` are the worker's (`entered`, `imported`, `built`, `bound`, and
    `factory_import_seconds`, a duration); an empty tuple when one is missing. The phases
    add up to `received - launch_begin`; negative spans (clock steps) count as 0.
    A standby worker's stamps have `activated`: its phases are STANDBY_PHASES, from
    the daemon's activation (`launch_begin` = `launched`, set by `ProcessWorker.activate`).
    """
    if isinstance(stamps.get("activated"), (int, float)) and isinstance(stamps.get("bound"), (int, float)):
        activated, bound = stamps["activated"], stamps["bound"]
        standby_spans = (activated - launched, bound - activated, received - bound)
        return tuple((name, max(0.0, float(span))) for name, span in zip(STANDBY_PHASES, standby_spans, strict=True))
    try:
        entered, imported = stamps["entered"], stamps["imported"]
        built, bound = stamps["built"], stamps["bound"]
        factory_imports = stamps.get("factory_import_seconds", 0.0)
    except (KeyError, TypeError):
        return ()
    spans = (
        launched - launch_begin,
        entered - launched,
        imported - entered + factory_imports,
        built - imported - factory_imports,
        bound - built,
        received - bound,
    )
    return tuple((name, max(0.0, float(span))) for name, span in zip(STARTUP_PHASES, spans, strict=True))


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

    def exitcode(self) -> int | None: ...
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

    async def close(self) -> None:
        """Release what the launcher holds besides the workers (standby workers); idempotent."""


class ProcessWorker:
    """A worker process plus the two pipes that tie it to the daemon.

    `handshake_conn` carries READY/FAILED from the worker. The lifeline is a
    socket pair: the daemon holds one end, and the worker exits when it reads
    EOF, which is what happens when the daemon dies, however it dies. Once
    READY, the worker's event loop writes one byte on it every heartbeat
    interval; a worker whose bytes stop for `heartbeat_timeout` seconds is
    wedged (a stage blocked the loop, or the process is stopped).
    """

    def __init__(
        self,
        group: str,
        process: Any,
        handshake_conn: Connection,
        lifeline: Connection,
        heartbeat_timeout: float = 0.0,
        activation: Connection | None = None,
    ) -> None:
        self.group = group
        self.process = process
        self.pid: int = process.pid
        self.heartbeat_timeout = heartbeat_timeout
        self._handshake = handshake_conn
        self._lifeline = lifeline
        self._exited: asyncio.Future[int | None] | None = None
        self.launch_begin = self.launched = 0.0
        """Wall-clock instants around `Process.start()`, for the handshake's phases (set by Launcher.start)."""
        self._activation = activation
        """The write end of a standby's activation pipe (None: not a standby, or already activated)."""
        self.spec: WorkerSpec | None = None
        """The blueprint it was started from (set by Launcher; a standby is used only for the same one)."""
        self.on_ready: Callable[[], None] | None = None
        """Called soon after the handshake reads READY (the launcher prepares the group's next standby)."""

    def activate(self, spec: WorkerSpec) -> bool:
        """Tell a standby worker to take over as `spec`'s worker (`Activation`): it binds that address and
        reports READY. False if it is gone."""
        assert self._activation is not None, "not a standby worker"
        self.launch_begin = self.launched = time.time()
        activation, self._activation = self._activation, None
        try:
            activation.send(Activation.of(spec))
            self.spec = spec
            return self.process.exitcode is None
        except OSError:
            return False
        finally:
            activation.close()

    async def handshake(self, timeout: float) -> Handshake:
        """Wait for READY; raise WorkerStartError on FAILED, EOF (the worker died) or timeout."""
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = self._handshake.fileno()
        loop.add_reader(fd, readable.set)
        try:
            await asyncio.wait_for(readable.wait(), timeout)
        except asyncio.TimeoutError:
            raise WorkerStartError(
                self.group, f"worker pid {self.pid} did not report READY within {timeout:g}s"
            ) from None
        finally:
            loop.remove_reader(fd)
        try:
            message = self._handshake.recv()
        except (EOFError, OSError):
            # The pipe closed before READY: the process died during initialization
            # (an import crash, an OOM kill, a segfault in a native extension).
            # Its pipe closes a moment before it can be reaped: wait briefly for the status.
            try:
                code = await asyncio.wait_for(self.wait_exit(), 2.0)
            except asyncio.TimeoutError:
                code = None
            raise WorkerStartError(
                self.group,
                f"worker pid {self.pid} died during initialization ({describe_exit(code)}); see its output above",
            ) from None
        if isinstance(message, WorkerFailed):
            raise WorkerStartError(self.group, message.message, stage=message.stage, traceback=message.traceback)
        if not isinstance(message, WorkerReady):
            raise WorkerStartError(self.group, f"worker pid {self.pid} sent {type(message).__name__}, not READY")
        stamps = message.stamps
        phases = startup_phases(self.launch_begin, self.launched, stamps, time.time())
        # A standby's CPU time is mostly its build, long before it was needed.
        cpu = None if "activated" in stamps else stamps.get("cpu_seconds")
        ready = Handshake(
            pid=self.pid,
            fraction_enforced=message.fraction_enforced,
            physical_gpu=message.physical_gpu,
            device=message.device,
            voices=message.voices,
            max_text_chars=message.max_text_chars,
            phases=phases,
            cpu_seconds=float(cpu) if cpu is not None else None,
            host=socket.gethostname(),
        )
        if self.on_ready is not None:
            # Soon, not now: the caller marks the group READY first, which starting a process would delay.
            asyncio.get_running_loop().call_soon(self._ready_callback, self.on_ready)
        return ready

    def _ready_callback(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # noqa: BLE001 - a standby is an optimization; the worker is READY regardless
            log.exception("group %r: could not prepare a standby worker", self.group)

    async def wait_exit(self) -> int | None:
        """Return the exit code once the process ends; any number of callers may wait at once."""
        if self._exited is None:
            # One reader on the sentinel shared by every waiter: a second add_reader on the
            # same fd would silently replace the first one's callback.
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[int | None] = loop.create_future()
            self._exited = exited
            sentinel = self.process.sentinel

            def reap() -> None:
                # The sentinel closes as the process exits; the zombie may lag a moment.
                if self.process.exitcode is None:
                    loop.call_later(0.005, reap)
                    return
                if not exited.done():
                    exited.set_result(self.process.exitcode)

            def on_sentinel() -> None:
                loop.remove_reader(sentinel)
                reap()

            if self.process.exitcode is not None:
                exited.set_result(self.process.exitcode)
            else:
                loop.add_reader(sentinel, on_sentinel)
        return await asyncio.shield(self._exited)

    async def unresponsive(self) -> str:
        """Return once no heartbeat byte arrived for `heartbeat_timeout` seconds; never, when that is 0."""
        if self.heartbeat_timeout <= 0:
            await asyncio.Future()  # heartbeats are off: wait until cancelled
        loop = asyncio.get_running_loop()
        fd = self._lifeline.fileno()
        os.set_blocking(fd, False)
        beat = asyncio.Event()
        closed = False

        def drain() -> None:
            nonlocal closed
            while not closed:
                try:
                    data = os.read(fd, 4096)
                except BlockingIOError:
                    return
                except OSError:
                    data = b""
                if not data:
                    # The worker is gone: its exit, not a missed beat, tells the story.
                    closed = True
                    loop.remove_reader(fd)
                    return
                beat.set()

        loop.add_reader(fd, drain)
        try:
            while True:
                try:
                    await asyncio.wait_for(beat.wait(), self.heartbeat_timeout)
                except asyncio.TimeoutError:
                    drain()  # a beat may sit unread when this loop itself was late
                    if closed:
                        await asyncio.Future()
                    if not beat.is_set():
                        return (
                            f"worker pid {self.pid} of group {self.group!r} did not answer its heartbeat "
                            f"for {self.heartbeat_timeout:g}s: its event loop is blocked (a synchronous call "
                            "in a stage's process()) or the process is stopped"
                        )
                beat.clear()
        finally:
            if not closed:
                loop.remove_reader(fd)

    def exitcode(self) -> int | None:
        code: int | None = self.process.exitcode
        return code

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.process.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Release the pipes and the process object; the process must have exited."""
        for conn in (self._handshake, self._lifeline, self._activation):
            try:
                if conn is not None:
                    conn.close()
            except OSError:
                pass
        self._activation = None
        if self._exited is not None and not self._exited.done():
            self._exited.get_loop().remove_reader(self.process.sentinel)
            self._exited.cancel()
        if self.process.exitcode is not None:
            self.process.close()


START_METHODS = ("forkserver", "spawn")
"""How workers start: forked from a preloaded fork server (fast restarts), or each a fresh interpreter."""

WORKER_PRELOAD = (
    "stagevisor.supervisor.worker.boot",
    "stagevisor.supervisor.worker.main",
    "stagevisor.supervisor.worker.node",
    "numpy",
)
"""What every worker imports, and the fork server imports once: import-only, fork-safe modules."""
FORK_SERVER_MODULE = "stagevisor.supervisor.worker.fork_server"
"""The fork server's first import: it ignores SIGTERM there, so a signal to the whole process group does not kill
every forked worker with it."""


def heartbeat_interval(timeout: float) -> float:
    """How often a worker beats for a given timeout: four beats per timeout, at least one a second; 0: off."""
    return 0.0 if timeout <= 0 else min(1.0, timeout / 4)


def forks_from_server(spec: WorkerSpec) -> bool:
    """Whether this group's worker forks from the fork server: a CPU group's does, a GPU group's is spawned.

    A GPU group's worker is a fresh interpreter started with only its device
    visible, so nothing in it (torch, onnxruntime's CUDA provider, an engine's
    allocator) sees another's; it loads CUDA and its model anyway, so the fork
    server would save it little.
    """
    return spec.group.gpu is None


def preload_modules(specs: Iterable[WorkerSpec], model_preload: Iterable[str] = ()) -> tuple[str, ...]:
    """The modules the fork server imports before it forks any worker. Pure.

    The worker's own stack plus the factory modules of stagevisor's built-in
    executors in groups without a GPU stage, and then what the model declares
    its workers preload (`model_preload`, the Plan's: e.g. a voice's graphs as
    bytes), only when such an executor is preloaded. Those import numpy, onnx and gRPC's Python modules only:
    no thread (but OpenBLAS's, which stops itself at fork), no channel, no
    server, no onnxruntime, no CUDA exists before a fork (gRPC initializes its
    core on the first channel or server).
    Executors from elsewhere and every GPU group's modules are imported after
    the fork, as with spawn, because what their import does is not known:
    torch must load only in GPU groups' workers.
    """
    modules = list(WORKER_PRELOAD)
    for spec in specs:
        if any(stage.gpu is not None for stage in spec.stages):
            continue
        for stage in spec.stages:
            module = (stage.factory or "").partition(":")[0]
            if module.startswith("stagevisor.stages.") and module not in modules:
                modules.append(module)
    if len(modules) > len(WORKER_PRELOAD):  # built-in executors in a forked worker: what their model declares
        modules.extend(m for m in model_preload if m not in modules)
    return tuple(modules)


CONSOLE_SCRIPT_IMPORTS = ("stagevisor.supervisor.cli",)
"""What the `stagevisor` console script imports (pyproject's [project.scripts])."""


def main_module_preload(main: Any) -> tuple[str, ...]:
    """What the fork server imports so that each forked worker re-runs the daemon's main module cheaply.

    multiprocessing runs the parent's main module again in every child, as
    `__mp_main__`, before the child's target: `python -m some.module` re-runs
    that module (imports and all), a script (the `stagevisor` console script
    of the systemd unit) is run again by path; only a package's `__main__`
    (`python -m stagevisor`) is skipped. With the module, or what the console
    script imports, already imported in the fork server, the re-run in a
    forked worker only executes the module's own body. (The fork server's own
    `__main__` preload never receives the path in Python 3.11.)
    """
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name:
        return () if name == "__main__" or name.endswith(".__main__") else (name,)
    return CONSOLE_SCRIPT_IMPORTS if getattr(main, "__file__", None) else ()


STANDBY_STOP_GRACE = 2.0
"""Seconds a discarded standby worker has to exit after SIGTERM before SIGKILL (it serves nothing)."""


def can_take_over(standby: WorkerSpec | None, spec: WorkerSpec) -> bool:
    """Whether a standby built from `standby` can serve as `spec`'s worker: the same blueprint, or one that
    differs only where it serves (a restart without a pause moves the group's worker to its other address),
    which its Activation carries. Pure."""
    return standby is not None and Activation.of(spec).apply(standby) == spec


def standby_groups(specs: Mapping[str, WorkerSpec], names: Iterable[str]) -> frozenset[str]:
    """The groups `--standby-worker` names, checked: each must exist and run on CPU only. Pure.

    Raises DaemonError naming the known groups, or the GPU group (its standby would
    hold a second copy of its model in GPU memory).
    """
    chosen = frozenset(names)
    unknown = sorted(chosen - set(specs))
    if unknown:
        raise DaemonError(
            f"--standby-worker names no process group: {', '.join(unknown)}; "
            f"the groups are {', '.join(specs)} (see `stagevisor plan`)"
        )
    gpu = sorted(name for name in chosen if specs[name].group.gpu is not None)
    if gpu:
        raise DaemonError(
            f"--standby-worker {gpu[0]}: the group has GPU stages, and its standby would hold a "
            "second copy of its models in GPU memory; standby workers are for CPU groups"
        )
    return chosen


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
            await asyncio.to_thread(self._warm)

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
