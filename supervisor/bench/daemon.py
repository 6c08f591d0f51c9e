"""The daemon under test: `stagevisor serve` in a subprocess on private sockets, watched and stopped by the bench."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable, Sequence, TypeVar

from stagevisor.supervisor import envs
from stagevisor.supervisor.bench.loadgen import stop_if_cancelled

T = TypeVar("T")


class Daemon:
    """`stagevisor serve` in a subprocess on private unix sockets, in its own session (Ctrl-C is ours)."""

    def __init__(self, args: Sequence[str], log: Callable[[str], None], python: str | None = None) -> None:
        """`python`: the interpreter that runs it (default this one's; another checkout's venv to compare)."""
        # Unix socket paths are short (about 100 bytes): fall back to /tmp under a long TMPDIR.
        base = tempfile.gettempdir()
        self.tmp = Path(tempfile.mkdtemp(prefix="svbench", dir=base if len(base) < 40 else "/tmp"))
        self.listen = f"unix:{self.tmp / 'public.sock'}"
        self.admin = f"unix:{self.tmp / 'admin.sock'}"
        self.log_path = self.tmp / "daemon.log"
        env = {**os.environ, envs.RUNTIME_DIR.name: str(self.tmp / "run")}
        env.pop("NOTIFY_SOCKET", None)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                # --http none first (a topology's own --http wins): bench speaks gRPC, and the default
                # 127.0.0.1:8000 would collide with any other daemon on the machine.
                [
                    python or sys.executable,
                    "-m",
                    "stagevisor",
                    "serve",
                    "--http",
                    "none",
                    *args,
                    "--listen",
                    self.listen,
                    "--admin-address",
                    self.admin,
                    "--log-level",
                    "WARNING",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._log = log

    async def wait_serving(self, timeout: float = 600.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(self.admin) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                ended = self.ended()
                if ended is not None:
                    raise RuntimeError(ended)
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    stop_if_cancelled()  # a Ctrl-C the call swallowed
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    stop_if_cancelled()
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the daemon was not SERVING within {timeout:g} s")

    def ended(self) -> str | None:
        """None while the daemon runs; else how it ended, then the tail of its log."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"exited with status {code}"
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        return f"the daemon {how}:\n" + self.log_path.read_text(errors="replace")[-2000:]

    async def while_serving(self, work: Awaitable[T], interval: float = 0.2) -> T:
        """`work`'s result; RuntimeError as soon as the daemon ends while it runs (`work` is cancelled then).

        A measurement must not outlive its daemon: its requests would fail at once, one after another, until
        the duration ran out, and the figures of a dead daemon would be reported as measured."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=interval)
                ended = self.ended()
                if ended is not None:
                    raise RuntimeError(f"during the measurement, {ended}")
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def worker_pids(self) -> dict[str, int]:
        import grpc

        from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
        from stagevisor.supervisor.reports import TopologyReport

        async with grpc.aio.insecure_channel(self.admin) as channel:
            message = await admin_pb2_grpc.AdminStub(channel).GetTopology(admin_pb2.GetTopologyRequest(), timeout=10)
        stop_if_cancelled()
        topology = TopologyReport.from_proto(message)
        pids = {group.name: group.pid for group in topology.groups if group.pid}
        pids.update({w.name: w.pid for group in topology.groups for w in group.workers if w.pid})  # replicas
        return pids

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (drain, stop workers), then SIGKILL to the whole session after `timeout`; then remove what a
        daemon that was killed (by us, or by anyone during the run) could not: its shared-memory area."""
        import shutil

        from stagevisor.supervisor.dataplane.shm import remove_orphan_areas

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._log("the daemon did not stop in time; killing it")
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=30)
        # A daemon ended by SIGKILL leaves its /dev/shm directory to the next daemon's start on this host; this
        # one was ours, reaped above, so its pid names no one else's.
        remove_orphan_areas(daemon=self.proc.pid)
        shutil.rmtree(self.tmp, ignore_errors=True)
