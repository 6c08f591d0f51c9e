"""The one OS seam of the daemon: start a worker process, read its handshake, hear its heartbeat, signal it, await its exit.

Everything above this module (daemon, lifecycle) sees a Worker handle and
never touches multiprocessing, signals or file descriptors, so tests replace
Launcher with a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Iterable, Iterator, Mapping, Protocol

from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.worker_spec import WorkerSpec, device_environment


@dataclass(frozen=True)
class Handshake:
    """What a worker reports once its stages are built and its data-plane endpoint serves."""

    pid: int
    fraction_enforced: bool
    physical_gpu: str | None = None
    """The device the worker's CUDA_VISIBLE_DEVICES names (None: not isolated, or a CPU group)."""
    device: str = ""
    """Where its GPU stages run: `cuda:0 (<name>, <uuid>)`, or `cpu`; empty for a CPU group."""
    voices: tuple[dict, ...] = ()
    """The voices the group's stages declare (their `voices` attribute), for GET /v1/audio/voices."""
    max_text_chars: int | None = None
    """The smallest `max_text_chars` the group's executors declare (stages/base.py), None when none does."""


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


class Worker(Protocol):
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
    """Starts the worker of one process group; the daemon's only way to create processes."""

    def start(self, spec: WorkerSpec) -> Worker: ...


class ProcessWorker:
    """A worker process plus the two pipes that tie it to the daemon.

    `handshake_conn` carries READY/FAILED from the worker. The lifeline is a
    socket pair: the daemon holds one end, and the worker exits when it reads
    EOF, which is what happens when the daemon dies, however it dies. Once
    READY, the worker's event loop writes one byte on it every heartbeat
    interval; a worker whose bytes stop for `heartbeat_timeout` seconds is
    wedged (a stage blocked the loop, or the process is stopped).
    """

    def __init__(self, group: str, process: Any, handshake_conn: Connection, lifeline: Connection,
                 heartbeat_timeout: float = 0.0) -> None:
        self.group = group
        self.process = process
        self.pid: int = process.pid
        self.heartbeat_timeout = heartbeat_timeout
        self._handshake = handshake_conn
        self._lifeline = lifeline
        self._exited: asyncio.Future | None = None

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
                f"worker pid {self.pid} died during initialization ({describe_exit(code)}); "
                "see its output above",
            ) from None
        if message.get("status") == "READY":
            return Handshake(pid=self.pid, fraction_enforced=bool(message.get("fraction_enforced")),
                             physical_gpu=message.get("physical_gpu"), device=message.get("device", ""),
                             voices=tuple(message.get("voices") or ()),
                             max_text_chars=message.get("max_text_chars"))
        raise WorkerStartError(
            self.group,
            message.get("message", "worker failed to start"),
            stage=message.get("stage", ""),
            traceback=message.get("traceback", ""),
        )

    async def wait_exit(self) -> int | None:
        """Return the exit code once the process ends; any number of callers may wait at once."""
        if self._exited is None:
            # One reader on the sentinel shared by every waiter: a second add_reader on the
            # same fd would silently replace the first one's callback.
            loop = asyncio.get_running_loop()
            self._exited = loop.create_future()
            sentinel = self.process.sentinel

            def reap() -> None:
                # The sentinel closes as the process exits; the zombie may lag a moment.
                if self.process.exitcode is None:
                    loop.call_later(0.005, reap)
                    return
                if not self._exited.done():
                    self._exited.set_result(self.process.exitcode)

            def on_sentinel() -> None:
                loop.remove_reader(sentinel)
                reap()

            if self.process.exitcode is not None:
                self._exited.set_result(self.process.exitcode)
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
                        return (f"worker pid {self.pid} of group {self.group!r} did not answer its heartbeat "
                                f"for {self.heartbeat_timeout:g}s: its event loop is blocked (a synchronous call "
                                "in a stage's process()) or the process is stopped")
                beat.clear()
        finally:
            if not closed:
                loop.remove_reader(fd)

    def exitcode(self) -> int | None:
        return self.process.exitcode

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
        for conn in (self._handshake, self._lifeline):
            try:
                conn.close()
            except OSError:
                pass
        if self._exited is not None and not self._exited.done():
            self._exited.get_loop().remove_reader(self.process.sentinel)
            self._exited.cancel()
        if self.process.exitcode is not None:
            self.process.close()


START_METHODS = ("forkserver", "spawn")
"""How workers start: forked from a preloaded fork server (fast restarts), or each a fresh interpreter."""

WORKER_PRELOAD = ("stagevisor.supervisor.worker", "stagevisor.supervisor.dataplane.node", "numpy")
"""What every worker imports, and the fork server imports once: import-only, fork-safe modules."""


VOICE_PRELOAD = "stagevisor.stages.preload"
"""Cuts the embedded voice's graph once in the fork server (pure data; see stages/preload.py)."""


def heartbeat_interval(timeout: float) -> float:
    """How often a worker beats for a given timeout: four beats per timeout, at least one a second; 0: off."""
    return 0.0 if timeout <= 0 else min(1.0, timeout / 4)


def preload_modules(specs: Iterable[WorkerSpec]) -> tuple[str, ...]:
    """The modules the fork server imports before it forks any worker. Pure.

    The worker's own stack plus the factory modules of stagevisor's built-in
    executors in groups without a GPU stage, and then the embedded voice's
    graphs as bytes. Those import numpy, onnx and gRPC's Python modules only:
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
    if len(modules) > len(WORKER_PRELOAD):  # built-in executors speak with the embedded voice
        modules.append(VOICE_PRELOAD)
    return tuple(modules)


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
    """

    def __init__(self, method: str = "forkserver", *, preload: Iterable[str] = WORKER_PRELOAD,
                 heartbeat_timeout: float = 0.0) -> None:
        if method not in START_METHODS:
            raise ValueError(f"worker start method must be one of {', '.join(START_METHODS)}, got {method!r}")
        if heartbeat_timeout < 0:
            raise ValueError(f"heartbeat timeout must be >= 0 seconds (0: off), got {heartbeat_timeout:g}")
        self.method = method
        self.heartbeat_timeout = heartbeat_timeout
        self._context = multiprocessing.get_context(method)
        if method == "forkserver":
            # Process-wide in multiprocessing: one fork server per daemon.
            self._context.set_forkserver_preload(list(preload))

    async def prepare(self) -> None:
        """Start the fork server and wait until it has preloaded, off the event loop.

        Otherwise the first `start` would block the daemon's loop (and its admin
        API) for as long as the imports take. No-op for spawn.
        """
        if self.method == "forkserver":
            await asyncio.to_thread(self._warm)

    def _warm(self) -> None:
        probe = self._context.Process(target=_ready_probe, name="stagevisor-forkserver-probe", daemon=True)
        # The fork server, and so every worker forked from it, starts with no GPU visible:
        # CPU groups fork from it; GPU groups are spawned with their own device (see start).
        with child_environment(device_environment((), os.environ)):
            probe.start()  # returns once the fork server, done preloading, has forked the probe
        probe.join()
        probe.close()

    def start(self, spec: WorkerSpec) -> ProcessWorker:
        from stagevisor.supervisor import worker as worker_main

        # A GPU group's worker is a fresh interpreter started with only its device visible, so
        # nothing in it (torch, onnxruntime's CUDA provider, an engine's allocator) sees another's;
        # it loads CUDA and its model anyway, so the fork server would save it little.
        context = multiprocessing.get_context("spawn") if spec.group.gpu is not None else self._context
        handshake_read, handshake_write = context.Pipe(duplex=False)
        # Duplex: a socket pair, so heartbeats travel back on the lifeline.
        lifeline_daemon, lifeline_worker = context.Pipe(duplex=True)
        process = context.Process(
            target=worker_main.main,
            args=(spec, handshake_write, lifeline_worker, heartbeat_interval(self.heartbeat_timeout)),
            name=f"stagevisor-worker-{spec.name}",
            daemon=False,
        )
        try:
            # A spawned child takes the environment at start(); a forked one already has the fork
            # server's, which hides every GPU (see _warm): worker.main applies spec.env again.
            with child_environment(spec.env):
                process.start()
        except BaseException:
            handshake_read.close()
            lifeline_daemon.close()
            raise
        finally:
            # Drop the parent's copies of the child's ends so EOF means the child is gone.
            handshake_write.close()
            lifeline_worker.close()
        return ProcessWorker(spec.name, process, handshake_read, lifeline_daemon,
                             heartbeat_timeout=self.heartbeat_timeout)
