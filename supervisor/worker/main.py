"""The worker process main: tie its life to the daemon, bind the GPU, build the stages, serve, report READY.

Runs in a process forked from the daemon's fork server or spawned (supervisor/daemon/launcher.py), called by
supervisor/worker/boot.py's main.
Order matters: the parent-death guards come first so that a worker can never
outlive its daemon, even if it hangs later while loading a model.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Mapping

from stagevisor.supervisor import envs
from stagevisor.stages.base import (
    declared_max_text_chars,
)
from stagevisor.supervisor.worker.handshake import Activation, WorkerFailed, WorkerReady, WorkerReport
from stagevisor.supervisor.worker.build import StageBuildError, build_stages, declared_voices
from stagevisor.supervisor.worker.gpu import bind_gpu
from stagevisor.supervisor.worker.spec import VISIBLE_DEVICES, WorkerSpec

log = logging.getLogger("stagevisor.worker")

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
WORKER_COMM_PREFIX = "sv:"
"""Workers name themselves `sv:<group>` (visible in /proc/PID/comm and `ps -o comm`)."""
WATCHDOG_INTERVAL = 0.5
STOP_GRACE = 5.0
"""Seconds a stopping worker that is not a replica waits for the requests it holds, when its stop timeout allows."""
STOP_RESERVE = 2.0
"""Seconds of the daemon's stop timeout a stopping worker keeps for after its drain (half of a stop timeout under
twice this): failing what it still holds, telling its peers, closing and exiting before the daemon's SIGKILL."""


def drain_budget(spec: WorkerSpec) -> float:
    """Seconds a stopping worker waits for the requests it holds: its drain grace (STOP_GRACE when it has none),
    cut short to end STOP_RESERVE (or half the stop timeout, when less) before the daemon's stop timeout. Pure."""
    grace = spec.drain_grace or STOP_GRACE
    if spec.stop_timeout is None:
        return grace
    reserve = min(STOP_RESERVE, spec.stop_timeout / 2)
    return max(0.0, min(grace, spec.stop_timeout - reserve))


def node_cache_dir(environ: Mapping[str, str] = os.environ) -> str:
    """Where a worker keeps what it may reuse across daemons on this node (the voice's optimized graphs):
    $XDG_CACHE_HOME/stagevisor/<version>, else ~/.cache/stagevisor/<version>.

    Per node and per stagevisor version: a Ray worker on another node finds its node's own copy, and
    an upgrade never reads graphs an older version wrote. Computed in the worker, on its node.
    """
    from stagevisor import __version__

    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "stagevisor", __version__)


def _guard_parent(spec: WorkerSpec, lifeline: Connection) -> None:
    """Exit as soon as the daemon is gone: PDEATHSIG, plus a watchdog on the lifeline for what it misses.

    The parent is the daemon (spawn) or the daemon's fork server, which exits
    with the daemon; either way EOF on the lifeline means the daemon is gone.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _set_title(spec.name)
    # The parent may have died between fork and prctl; PDEATHSIG would not fire then.
    if os.getppid() != parent:
        os._exit(1)
    fd = lifeline.fileno()
    os.set_blocking(fd, False)  # heartbeats must never block the event loop

    def watch() -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if poller.poll(WATCHDOG_INTERVAL * 1000):
                try:
                    if not os.read(fd, 4096):
                        os._exit(1)  # EOF: no cleanup, nothing may delay releasing GPU memory
                except BlockingIOError:
                    pass
                except OSError:
                    os._exit(1)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="stagevisor-watchdog", daemon=True).start()


async def _heartbeat(lifeline: Connection, interval: float) -> None:
    """Write one byte on the lifeline every `interval` seconds, from the event loop itself.

    The daemon replaces a worker whose bytes stop: that is how a loop blocked
    by a synchronous call, or a stopped process, is told from a busy one.
    """
    fd = lifeline.fileno()
    while True:
        try:
            os.write(fd, b".")
        except BlockingIOError:
            pass  # the daemon is behind on reading; the next beat will do
        except OSError:
            return  # the daemon is gone; the watchdog ends this process
        await asyncio.sleep(interval)


def _set_title(name: str) -> None:
    """Name this process `sv:<name>` (/proc/PID/comm keeps 15 bytes). Call it from the main thread: the name is
    the calling thread's, and the main thread's is the process's."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p((WORKER_COMM_PREFIX + name).encode()[:15]), 0, 0, 0)


def _configure_logging(spec: WorkerSpec) -> None:
    from stagevisor.supervisor import logs

    logs.configure(spec.log_level, _log_prefix(spec.name))


def _log_prefix(name: str) -> str:
    return f"{name} pid %(process)d"


def renamed(name: str) -> None:
    """The daemon runs this worker under `name` now (a scale between one replica and more): its process title and
    log lines say so, as `status` and `topology` do. Its data-plane peer name stays the one it started with."""
    from stagevisor.supervisor import logs

    _set_title(name)
    logs.rename(_log_prefix(name))
    log.info("this worker is %r now (its group was scaled)", name)


async def _await_activation(activation: Connection, stop: asyncio.Event) -> Activation | None:
    """A standby worker waits here, built: the daemon's Activation once it sends one, None on EOF or SIGTERM."""
    loop = asyncio.get_running_loop()
    fd = activation.fileno()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    waits = [asyncio.ensure_future(readable.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(fd)
        for wait in waits:
            wait.cancel()
    if stop.is_set():
        return None
    try:
        message = activation.recv()
    except (EOFError, OSError):
        return None
    return message if isinstance(message, Activation) else None


async def _serve(
    spec: WorkerSpec,
    handshake: Connection,
    lifeline: Connection,
    heartbeat_interval: float,
    stamps: dict[str, float],
    activation: Connection | None = None,
) -> int:
    from stagevisor.supervisor.worker.endpoint import WorkerEndpoint

    stop = asyncio.Event()

    binding = bind_gpu(spec)
    if binding.warning:
        log.warning(binding.warning)
    try:
        stages = await build_stages(spec, stamps)
        if spec.record_handoffs:
            from stagevisor.supervisor.worker.handoffs import record_handoffs

            stages = record_handoffs(spec.record_handoffs, spec.group.name, stages)
        # Only once built: until then SIGTERM keeps its default action, so a worker stopped while it loads a model
        # (a shutdown or an apply during a restart or a scale) exits at once; it holds no request to finish.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        if activation is not None:
            # A standby (launcher.Launcher, --standby-worker): built, it binds nothing until the group's
            # worker is gone and the daemon hands it the address to serve.
            log.info("standby: stages %s built; waiting to take over", ", ".join(stages))
            taking_over = await _await_activation(activation, stop)
            if taking_over is None:
                return 0
            stamps["activated"] = time.time()
            spec = taking_over.apply(spec)
        endpoint = WorkerEndpoint(spec, stages)
        endpoint.runtime.on_renamed = renamed
        await endpoint.start()
        stamps["bound"] = time.time()
    except StageBuildError as error:
        _send(
            handshake,
            WorkerFailed(str(error), error.stage, "".join(traceback.format_exception(error.cause))),
        )
        return 1
    except Exception as error:
        _send(handshake, WorkerFailed(f"worker failed to start its data plane: {error}", "", traceback.format_exc()))
        return 1
    # Read back from this process's own environment: the device it really runs on.
    isolated_gpu = None
    if spec.group.gpu is not None and spec.isolated:
        visible = os.environ.get(VISIBLE_DEVICES, "").split(",")
        local = spec.local_gpu
        isolated_gpu = visible[local].strip() if local is not None and local < len(visible) else None
    # Logged before the handshake, so it comes ahead of the daemon's READY lines.
    log.info(
        "READY: stages %s on %s%s",
        ", ".join(stages),
        spec.address,
        f" and {endpoint.tcp_address} ({endpoint.directory.security.describe()})"
        if endpoint.tcp_address and endpoint.directory is not None
        else "",
    )
    _send(
        handshake,
        WorkerReady(
            pid=os.getpid(),
            fraction_enforced=binding.fraction_enforced,
            physical_gpu=isolated_gpu or None,
            device=binding.device,
            voices=tuple(declared_voices(stages)),
            max_text_chars=declared_max_text_chars(stages.values()),
            data_address=endpoint.tcp_address,
            stamps={**stamps, "cpu_seconds": sum(os.times()[:2])},
        ),
    )
    handshake.close()
    beat = asyncio.create_task(_heartbeat(lifeline, heartbeat_interval)) if heartbeat_interval > 0 else None
    await stop.wait()
    grace = drain_budget(spec)
    log.info("stopping: the requests held here have %.1fs to end", grace)
    try:
        await endpoint.stop(grace)
    finally:
        if beat is not None:  # beating through the drain: the daemon kills a worker that stops beating
            beat.cancel()
    return 0


def _send(conn: Connection, message: WorkerReport) -> None:
    try:
        conn.send(message)
    except (BrokenPipeError, OSError):
        pass  # the daemon is gone; the watchdog ends this process


def main(
    spec: WorkerSpec,
    handshake: Connection,
    lifeline: Connection,
    heartbeat_interval: float = 0.0,
    stamps: dict[str, float] | None = None,
    activation: Connection | None = None,
) -> None:
    """Entry point of a worker (called by worker/boot.py's main); 0 heartbeat interval: no heartbeats.

    `stamps`: wall-clock instants of its start so far (`entered`, `imported`);
    the READY handshake carries them with the later ones. With `activation`, a
    standby: it builds its stages, then waits for the daemon's byte on that pipe
    before it binds its address and reports READY (EOF: it exits).
    """
    stamps = dict(stamps or {})
    stamps.setdefault("entered", time.time())
    stamps.setdefault("imported", stamps["entered"])
    _guard_parent(spec, lifeline)
    # Normally already in the environment this process was started with (launcher.child_environment);
    # applied again before anything can load CUDA, in case the daemon's environment changed meanwhile.
    os.environ.update(spec.env)
    # SIGINT (Ctrl-C reaches the daemon's process group; the worker has its own, see boot.py, but a signal to a
    # whole cgroup reaches it too): only the daemon decides when a worker stops, so that a drain is not cut short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _configure_logging(spec)
    # An operator's own setting wins: a directory of their choice, or empty to turn caching off.
    os.environ.setdefault(envs.CACHE_DIR.name, spec.cache_dir or node_cache_dir())
    # Before any factory is imported: the user's packages beside the config or in --app-dir.
    sys.path[:0] = [path for path in spec.import_paths if path not in sys.path]
    code = asyncio.run(_serve(spec, handshake, lifeline, heartbeat_interval, stamps, activation))
    # Skip interpreter teardown: stage objects (CUDA contexts, onnxruntime sessions)
    # can hang in their finalizers, and the daemon is waiting for this exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
