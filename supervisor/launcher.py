"""The one OS seam of the daemon: spawn a worker process, read its handshake, signal it, await its exit.

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
from typing import Any, Iterator, Mapping, Protocol

from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.worker_spec import WorkerSpec


@dataclass(frozen=True)
class Handshake:
    """What a worker reports once its stages are built and its data-plane endpoint serves."""

    pid: int
    fraction_enforced: bool
    physical_gpu: str | None = None
    """The device the worker's CUDA_VISIBLE_DEVICES names (None: not isolated, or a CPU group)."""
    device: str = ""
    """Where its GPU stages run: `cuda:0 (<name>, <uuid>)`, or `cpu`; empty for a CPU group."""


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

    def exitcode(self) -> int | None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


class WorkerLauncher(Protocol):
    """Starts the worker of one process group; the daemon's only way to create processes."""

    def start(self, spec: WorkerSpec) -> Worker: ...


class ProcessWorker:
    """A spawned worker process plus the two pipes that tie it to the daemon.

    `handshake_conn` carries READY/FAILED from the worker. The daemon holds the
    write end of the lifeline; the worker exits when it reads EOF, which is
    what happens when the daemon dies, however it dies.
    """

    def __init__(self, group: str, process: Any, handshake_conn: Connection, lifeline: Connection) -> None:
        self.group = group
        self.process = process
        self.pid: int = process.pid
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
                             physical_gpu=message.get("physical_gpu"), device=message.get("device", ""))
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


class Launcher:
    """Starts worker processes with the spawn method (never fork: gRPC and CUDA are not fork-safe).

    Call `start` from the daemon's main thread: PR_SET_PDEATHSIG in the child
    fires when the *thread* that created it exits.
    """

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")

    def start(self, spec: WorkerSpec) -> ProcessWorker:
        from stagevisor.supervisor import worker as worker_main

        handshake_read, handshake_write = self._context.Pipe(duplex=False)
        lifeline_read, lifeline_write = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=worker_main.main,
            args=(spec, handshake_write, lifeline_read),
            name=f"stagevisor-worker-{spec.group.name}",
            daemon=False,
        )
        with child_environment(spec.env):
            process.start()
        # Drop the parent's copies of the child's ends so EOF means the child is gone.
        handshake_write.close()
        lifeline_read.close()
        return ProcessWorker(spec.group.name, process, handshake_read, lifeline_write)
