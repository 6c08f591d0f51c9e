"""A local worker process as the daemon holds it (ProcessWorker): handshake, exit, heartbeat, signals, standby.

It reads the worker's pipes and signals it; launcher.py starts it. Also the
phases of a worker's start, from the READY handshake's stamps (`startup_phases`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping

from stagevisor.supervisor.daemon.handle import (
    Handshake,
    describe_exit,
    describe_silence,
    describe_unresponsive,
    silence_limit,
)
from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.pids import pid_stopped
from stagevisor.supervisor.worker.handshake import Activation, WorkerFailed, WorkerReady
from stagevisor.supervisor.worker.spec import WorkerSpec

log = logging.getLogger("stagevisor.daemon")


STARTUP_PHASES = ("launch", "interpreter", "imports", "build", "serve", "handshake")
"""A worker's start, in order (see `startup_phases`)."""
STANDBY_PHASES = ("standby activation", "serve", "handshake")
"""A standby worker's start, which built its stages before it was needed (see `startup_phases`)."""


def startup_phases(
    launch_begin: float, launched: float, stamps: Mapping[str, float], received: float
) -> tuple[tuple[str, float], ...]:
    """Split a worker's start into STARTUP_PHASES from wall-clock instants. Pure.

    - launch: the daemon's `Process.start()` (a round trip to the fork server, or fork+exec);
    - interpreter: until worker/boot.py's main runs (a fresh interpreter and multiprocessing's bootstrap
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


class Heartbeats:
    """The heartbeat bytes a worker writes on its lifeline, read by one reader on the loop for every watcher.

    Each read of one or more bytes is a beat. EOF means the worker is gone: then nothing here returns any more,
    and its exit, not a missed beat, tells the story.
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self.last = loop.time()
        """Loop time of the last beat read (the reader's start, before the first)."""
        self.closed = False
        self._next: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self.read)

    def read(self) -> None:
        """Take every byte waiting on the lifeline."""
        beat = False
        while not self.closed:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.close()
                break
            beat = True
        if beat:
            self.last = self._loop.time()
            beaten, self._next = self._next, self._loop.create_future()
            beaten.set_result(None)

    async def silent_for(self, seconds: float) -> float:
        """Return the silence once no beat came for `seconds`; never once the worker is gone."""
        while not self.closed:
            gap = self._loop.time() - self.last
            if gap >= seconds:
                self.read()  # a beat may sit unread when this loop itself was late
                gap = self._loop.time() - self.last
                if gap >= seconds and not self.closed:
                    return gap
                continue
            # Not asyncio.wait_for: cancelled as a beat resolves the future it waits on, it returns that result
            # instead (Python < 3.12), and the runner's cancelled watch would wait on, then be destroyed pending.
            await asyncio.wait({self._next}, timeout=seconds - gap)
        never: asyncio.Future[float] = self._loop.create_future()
        return await never

    async def next_beat(self) -> None:
        """Return at the next beat; never once the worker is gone."""
        await asyncio.shield(self._next)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._loop.remove_reader(self._fd)


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
        self._heartbeats: Heartbeats | None = None

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
                f"worker pid {self.pid} died during initialization ({describe_exit(code)}); "
                "see its output in the daemon log",
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
        await self._beats().silent_for(self.heartbeat_timeout)
        return describe_unresponsive(self.pid, self.group, self.heartbeat_timeout, stopped=pid_stopped(self.pid))

    async def silent(self) -> str:
        limit = silence_limit(self.heartbeat_timeout)
        if limit <= 0:
            await asyncio.Future()  # heartbeats are off: wait until cancelled
        return describe_silence(self.pid, self.group, await self._beats().silent_for(limit))

    async def beating(self) -> None:
        if self.heartbeat_timeout <= 0:
            await asyncio.Future()  # heartbeats are off: wait until cancelled
        await self._beats().next_beat()

    def _beats(self) -> Heartbeats:
        """The lifeline's reader, started by the first watcher (the worker beats only once READY)."""
        if self._heartbeats is None:
            self._heartbeats = Heartbeats(self._lifeline.fileno(), asyncio.get_running_loop())
        return self._heartbeats

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
        if self._heartbeats is not None:
            self._heartbeats.close()
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
