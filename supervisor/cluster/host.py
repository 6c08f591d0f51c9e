"""The Ray actor that hosts one worker on its node: it starts the worker main there and relays its pipes.

The actor is the worker process's parent, on the node Ray placed it on. It
starts `python -m stagevisor.supervisor.cluster.host` (a fresh interpreter, as the
spawn launcher does) with the same handshake pipe and lifeline socket pair
the local launcher uses, so `worker.main` runs unchanged: it exits when the
actor dies (PR_SET_PDEATHSIG, EOF on its lifeline), and the actor dies with the
daemon's Ray job. The daemon (supervisor/cluster/worker.py) calls the methods
below remotely; they block in the actor's threads, never in the daemon.

No module-level Ray import: the worker process imports this module too.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Callable

from stagevisor.supervisor.worker.handshake import WorkerReport
from stagevisor.supervisor.worker.spec import VISIBLE_DEVICES, WorkerSpec

RAY_VISIBLE = VISIBLE_DEVICES
HOST_CONCURRENCY = 8
"""Threads of a host actor: handshake, wait_exit, unresponsive, next_beat and signals may all block at once."""


def ray_device_env(spec: WorkerSpec, environ: dict[str, str] | Any) -> WorkerSpec:
    """The spec with the GPU Ray gave this actor (its CUDA_VISIBLE_DEVICES) in place of the daemon's placement GPU.

    The daemon's placement GPU ids count the daemon host's devices; on a Ray
    node the device is the one Ray assigned. Pure.
    """
    if spec.group.gpu is None or RAY_VISIBLE not in environ or RAY_VISIBLE not in spec.env:
        return spec
    return replace(spec, env={**spec.env, RAY_VISIBLE: environ[RAY_VISIBLE]})


def on_node(spec: WorkerSpec, node_id: str, node_ip: str) -> WorkerSpec:
    """The spec of a worker on this Ray node: it listens on TCP at the node's IP too, and dials peers on
    other nodes there (supervisor/dataplane/peers.py). Pure."""
    return replace(spec, node_id=node_id, node_ip=node_ip)


@dataclass(frozen=True)
class HostHandshake:
    """What a host actor relays of its worker's start: the worker's report and the node it ran on."""

    report: WorkerReport | None
    """READY or FAILED as the worker sent it; None when it sent nothing (timed out, or died)."""
    node_id: str
    hostname: str
    timed_out: bool = False
    """No report within the start timeout (the worker still runs)."""
    exitcode: int | None = None
    """With no report and not timed out: the worker died, with this status (None: unknown)."""


class Heartbeats:
    """A worker's heartbeats as its host hears them on the lifeline: when it last beat, and whether the lifeline
    closed (the worker is gone). `exited` says whether the worker process ended by other means; `since`
    (monotonic seconds) is when it started, the last beat before the first."""

    def __init__(self, exited: Callable[[], bool], since: float | None = None) -> None:
        self._lock = threading.Condition()
        self._last = time.monotonic() if since is None else since
        self._closed = False
        self._exited = exited

    def beat(self) -> None:
        """A heartbeat byte came."""
        with self._lock:
            self._last = time.monotonic()
            self._lock.notify_all()

    def close(self) -> None:
        """EOF on the lifeline: the worker is gone."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def unresponsive(self, timeout: float) -> float | None:
        """Block until no heartbeat came for `timeout` seconds and return that silence; None once the worker exited.

        The silence counts from this call at the earliest: a worker beats only once READY, however long
        its start took.
        """
        called = time.monotonic()
        with self._lock:
            while True:
                if self._closed or self._exited():
                    return None
                silence = time.monotonic() - max(self._last, called)
                if silence >= timeout:
                    return silence
                self._lock.wait(timeout - silence)

    def next_beat(self) -> bool:
        """Block until the worker's next heartbeat (True); False once the worker exited."""
        with self._lock:
            last = self._last
            while self._last == last:
                if self._closed or self._exited():
                    return False
                self._lock.wait(1.0)  # an exit without EOF on the lifeline is seen within a second
            return True


class WorkerHost:
    """One worker process on this node, as the daemon's Ray actor (threaded: HOST_CONCURRENCY)."""

    def __init__(self, spec: WorkerSpec, heartbeat_interval: float, deferred: bool = False) -> None:
        """Start the worker at once; `deferred` (a TP rank): only once `launch` gives it its peers' GPUs."""
        self._node_ip = _node_ip()
        spec = on_node(spec, self._node()[0], self._node_ip)
        self.group = spec.group.name
        self._process: subprocess.Popen[bytes] | None = None
        self.heartbeats = Heartbeats(exited=lambda: self._proc.poll() is not None)
        """What the lifeline says of the worker; unresponsive and next_beat ask it."""
        self._deferred = (spec, heartbeat_interval) if deferred else None
        if not deferred:
            self._start(ray_device_env(spec, os.environ), heartbeat_interval)

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        """The worker process, once `_start`'s thread has started it."""
        assert self._process is not None, "the worker process has been started"
        return self._process

    def _start(self, spec: WorkerSpec, heartbeat_interval: float) -> None:
        handshake_read, handshake_write = os.pipe()
        lifeline_host, lifeline_worker = socket.socketpair()
        self._handshake = Connection(handshake_read, writable=False)
        self._lifeline = lifeline_host
        started = threading.Event()
        self._start_error: BaseException | None = None
        payload = pickle.dumps((spec, heartbeat_interval))

        def run() -> None:
            # The worker sets PR_SET_PDEATHSIG, which fires when the *thread* that started it exits:
            # this thread lives until the worker does.
            try:
                self._process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "stagevisor.supervisor.cluster.host",
                        str(handshake_write),
                        str(lifeline_worker.fileno()),
                    ],
                    stdin=subprocess.PIPE,
                    pass_fds=(handshake_write, lifeline_worker.fileno()),
                    env={**os.environ, **spec.env},
                    close_fds=True,
                )
            except BaseException as error:  # noqa: BLE001 - reported by handshake()
                self._start_error = error
                started.set()
                return
            finally:
                os.close(handshake_write)
                lifeline_worker.close()
            started.set()
            try:
                stdin = self._proc.stdin
                assert stdin is not None, "started with stdin=PIPE"
                stdin.write(payload)
                stdin.close()
            except OSError:
                pass  # it died at once: its exit tells
            self._proc.wait()

        threading.Thread(target=run, name=f"stagevisor-host-{self.group}", daemon=True).start()
        started.wait()
        if self._start_error is not None:
            raise self._start_error
        threading.Thread(target=self._drain_lifeline, name="stagevisor-lifeline", daemon=True).start()

    # -- remote methods ----------------------------------------------------

    def pid(self) -> int:
        return self._process.pid if self._process else 0

    def devices(self) -> dict[str, str]:
        """The GPUs Ray gave this actor (its CUDA_VISIBLE_DEVICES, "" for none) and this node's identity."""
        node_id, hostname = self._node()
        return {"visible": os.environ.get(RAY_VISIBLE, ""), "node_id": node_id, "hostname": hostname}

    def launch(self, visible: str) -> int:
        """Start a deferred worker seeing `visible` (every rank's GPU, in rank order); its pid."""
        if self._deferred is None:
            return self.pid()
        (spec, interval), self._deferred = self._deferred, None
        if spec.group.gpu is not None and RAY_VISIBLE in spec.env and visible:
            spec = replace(spec, env={**spec.env, RAY_VISIBLE: visible})
        self._start(spec, interval)
        return self.pid()

    def handshake(self, timeout: float) -> HostHandshake:
        """The worker's READY/FAILED report, or none (it timed out, or died with its exit code), and this node."""
        node_id, hostname = self._node()
        if not self._handshake.poll(timeout):
            return HostHandshake(None, node_id, hostname, timed_out=True)
        try:
            report = self._handshake.recv()
        except (EOFError, OSError):
            try:
                code = self._proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
            return HostHandshake(None, node_id, hostname, exitcode=code)
        finally:
            self._handshake.close()
        return HostHandshake(report, node_id, hostname)

    def wait_exit(self) -> int | None:
        """Block until the worker exits; its exit status (negative: the signal that killed it)."""
        return self._proc.wait()

    def unresponsive(self, timeout: float) -> float | None:
        """Block until no heartbeat came for `timeout` seconds and return that silence; None once the worker exited
        (Heartbeats.unresponsive: the silence counts from this call at the earliest)."""
        return self.heartbeats.unresponsive(timeout)

    def next_beat(self) -> bool:
        """Block until the worker's next heartbeat (True); False once the worker exited."""
        return self.heartbeats.next_beat()

    def signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                os.kill(self._process.pid, signum)
            except ProcessLookupError:
                pass

    # -- internals ---------------------------------------------------------

    def _drain_lifeline(self) -> None:
        """Note each heartbeat byte; EOF means the worker is gone."""
        while True:
            try:
                data = self._lifeline.recv(4096)
            except OSError:
                data = b""
            if not data:
                self.heartbeats.close()
                return
            self.heartbeats.beat()

    @staticmethod
    def _node() -> tuple[str, str]:
        """(Ray node id, host name) of this actor's node."""
        node_id = ""
        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - a description only
            pass
        return node_id, socket.gethostname()


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception as error:  # noqa: BLE001 - no TCP listener then: peers on other nodes cannot reach it
        logging.getLogger("stagevisor.cluster").warning(
            "cannot read this node's IP address from Ray (%s): the worker here listens on a unix socket only, so "
            "workers on other nodes cannot reach it",
            error,
        )
        return ""


def _child_main(argv: list[str]) -> None:
    """The worker process: read (spec, heartbeat interval) from stdin, run worker.main on the inherited pipes."""
    from stagevisor.supervisor.worker import main as worker

    handshake_fd, lifeline_fd = int(argv[0]), int(argv[1])
    spec, interval = pickle.loads(sys.stdin.buffer.read())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker.main(spec, Connection(handshake_fd, readable=False), Connection(lifeline_fd), interval)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
