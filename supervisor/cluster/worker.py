"""RayWorker: the WorkerHandle of one worker (a replica, a TP rank) running under a Ray actor on a cluster node."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any, Callable, Coroutine, ParamSpec, TypeVar

from stagevisor.supervisor.cluster.actor import HostActor, RemoteMethod
from stagevisor.supervisor.cluster.connect import first_line
from stagevisor.supervisor.cluster.tp import TpGang
from stagevisor.supervisor.daemon.handle import (
    Handshake,
    describe_exit,
    describe_silence,
    describe_unresponsive,
    silence_limit,
)
from stagevisor.supervisor.errors import WorkerStartError
from stagevisor.supervisor.worker.handshake import WorkerFailed, WorkerReady

log = logging.getLogger("stagevisor.daemon")

P = ParamSpec("P")
R = TypeVar("R")

REPLY_GRACE = 30.0
"""Seconds beyond a worker's own timeout the daemon waits for its actor's answer (scheduling, a slow node)."""


class RayWorker:
    """The WorkerHandle of a worker under a Ray actor (the protocol of supervisor/daemon/handle.py)."""

    def __init__(
        self,
        group: str,
        actor: HostActor,
        ray: Any,
        *,
        heartbeat_timeout: float,
        name: str,
        lacks: Callable[[], list[str]] = list,
        address: str = "",
        on_ready: Callable[["RayWorker"], None] | None = None,
        tp: "tuple[TpGang, int] | None" = None,
    ) -> None:
        self.group = group
        self.tp = tp
        """(its stage's TpGang, its rank) for a TP rank: its actor starts the worker once every rank reported."""
        self.actor = actor
        self.name = name
        self.pid = 0
        self.host = ""
        self.heartbeat_timeout = heartbeat_timeout
        self._ray = ray
        self._lacks = lacks
        self._exit: asyncio.Future[int | None] | None = None
        self._code: int | None = None
        self.address = address
        """Its data-plane address in `routes`."""
        self.node_id = ""
        self.data_address = ""
        """host:port it listens on for peers on other nodes (from its READY handshake)."""
        self._on_ready = on_ready

    async def _call(self, method: RemoteMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Call `method` of the actor and wait for its answer; the call is sent once this is awaited."""
        return await self._call_within(None, method, *args, **kwargs)

    async def _call_within(
        self, timeout: float | None, method: RemoteMethod[P, R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`_call`, giving up with asyncio.TimeoutError after `timeout` seconds (None: never)."""
        ref = method.remote(*args, **kwargs)
        return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)

    async def handshake(self, timeout: float) -> Handshake:
        """READY from the worker on its node; WorkerStartError on FAILED, death, or no node that fits."""
        ray = self._ray
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            if self.tp is None:
                self.pid = await self._placed(self._call(self.actor.pid), timeout, deadline)
            else:
                devices = await self._placed(self._call(self.actor.devices), timeout, deadline)
                self.pid = await self._launch_rank(devices, deadline)
            left = max(0.0, deadline - loop.time())
            reply = await self._call_within(left + REPLY_GRACE, self.actor.handshake, left)
        except asyncio.TimeoutError:
            raise WorkerStartError(
                self.group,
                f"the Ray actor {self.name} of {self.group!r} did not answer within {timeout + REPLY_GRACE:g}s",
            ) from None
        except ray.exceptions.RayError as error:
            lacks = await asyncio.to_thread(self._lacks)  # its node went away, and with it the last that fits?
            why = f"; Ray cannot place it again (CLUSTER_LACKS): {'; '.join(lacks)}" if lacks else ""
            raise WorkerStartError(
                self.group,
                f"the Ray actor {self.name} of {self.group!r} died before the "
                f"worker was READY: {first_line(error)}{why}",
            ) from None
        self.host = reply.hostname
        where = f"on node {reply.hostname} ({reply.node_id[:12]})"
        report = reply.report
        if isinstance(report, WorkerReady):
            self.pid = report.pid or self.pid
            self.node_id, self.data_address = reply.node_id, report.data_address
            log.info(
                "group %r: worker pid %d %s, Ray actor %s%s",
                self.group,
                self.pid,
                where,
                self.name,
                f", data plane also at {self.data_address}" if self.data_address else "",
            )
            if self._on_ready is not None:  # before READY: peers learn where it is before a request can go there
                self._on_ready(self)
            return Handshake(
                pid=self.pid,
                fraction_enforced=report.fraction_enforced,
                physical_gpu=report.physical_gpu,
                device=report.device,
                voices=report.voices,
                max_text_chars=report.max_text_chars,
                host=reply.hostname,
                node_id=reply.node_id,
                data_address=self.data_address,
            )
        if isinstance(report, WorkerFailed):
            raise WorkerStartError(self.group, report.message, stage=report.stage, traceback=report.traceback)
        if reply.timed_out:
            raise WorkerStartError(
                self.group, f"worker pid {self.pid} {where} did not report READY within {timeout:g}s"
            )
        raise WorkerStartError(
            self.group,
            f"worker pid {self.pid} {where} died during initialization "
            f"({describe_exit(reply.exitcode)}); see its output in the daemon log",
        )

    async def _placed(self, first_call: Coroutine[Any, Any, R], timeout: float, deadline: float) -> R:
        """The answer to the actor's first call, which comes once Ray placed the actor.

        An actor Ray cannot place waits forever: say so at once when no alive node could ever take it,
        and give up at `deadline` (the start timeout, `timeout` seconds) when the nodes that fit stay busy.
        """
        loop = asyncio.get_running_loop()
        scheduled = asyncio.ensure_future(first_call)
        try:
            while True:
                await asyncio.wait({scheduled}, timeout=1.0)
                if scheduled.done():
                    return scheduled.result()
                lacks = await asyncio.to_thread(self._lacks)
                if lacks:
                    raise WorkerStartError(
                        self.group, f"Ray cannot place the worker of {self.group!r} (CLUSTER_LACKS): {'; '.join(lacks)}"
                    )
                if loop.time() > deadline:
                    raise WorkerStartError(
                        self.group,
                        f"Ray did not place the worker of {self.group!r} within "
                        f"{timeout:g}s: the nodes that fit it are busy (see `ray status`)",
                    )
        finally:
            scheduled.cancel()

    async def _launch_rank(self, devices: dict[str, str], deadline: float) -> int:
        """A TP rank: wait for every rank of its stage on its node, then start its worker seeing their GPUs."""
        assert self.tp is not None, "a TP rank's worker has its gang"
        gang, rank = self.tp
        node = devices.get("node_id", "")
        try:
            visible = await gang.gather(
                rank, node, devices.get("visible", ""), max(0.0, deadline - asyncio.get_running_loop().time())
            )
        except asyncio.TimeoutError:
            raise WorkerStartError(
                self.group,
                f"TP rank {rank} of stage {gang.stage!r} waited in vain for ranks "
                f"{gang.missing(node)} to be placed on its node {node[:12]} (placement group "
                f"{gang.name}, see `ray status`)",
            ) from None
        return await self._call_within(REPLY_GRACE, self.actor.launch, visible)

    async def wait_exit(self) -> int | None:
        """The worker's exit status; None when its actor died with it (killed, or its node went away)."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._await_exit())
        return await asyncio.shield(self._exit)

    async def _await_exit(self) -> int | None:
        try:
            self._code = await self._call(self.actor.wait_exit)
        except self._ray.exceptions.RayError as error:
            log.error("group %r: Ray actor %s is gone: %s", self.group, self.name, first_line(error))
            self._code = None
        return self._code

    async def unresponsive(self) -> str:
        silence = await self._silence(self.heartbeat_timeout)
        return describe_unresponsive(self.pid, self.group, silence, self.host)

    async def silent(self) -> str:
        silence = await self._silence(silence_limit(self.heartbeat_timeout))
        return describe_silence(self.pid, self.group, silence, self.host)

    async def _silence(self, seconds: float) -> float:
        """The silence once the host saw no heartbeat for `seconds`; never when that is 0 (heartbeats off), nor
        once the worker exited or its actor is gone (wait_exit tells the story)."""
        if seconds > 0:
            try:
                silence = await self._call(self.actor.unresponsive, seconds)
            except self._ray.exceptions.RayError:
                silence = None
            if silence is not None:
                return float(silence)
        never: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        return await never

    async def beating(self) -> None:
        if self.heartbeat_timeout <= 0:
            await asyncio.Future()
        try:
            beat = await self._call(self.actor.next_beat)
        except self._ray.exceptions.RayError:
            beat = False
        if not beat:  # it exited, or its actor is gone: wait_exit tells the story
            await asyncio.Future()

    @property
    def exited(self) -> bool:
        """Its exit status is known, or the wait for it ended (its actor is gone)."""
        return self._code is not None or (self._exit is not None and self._exit.done())

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the worker; its actor goes too, so an actor Ray never placed (or a wedged one) ends as well."""
        self._signal(signal.SIGKILL)
        self._ray.kill(self.actor, no_restart=True)

    def _signal(self, signum: int) -> None:
        try:
            self.actor.signal.remote(signum)
        except self._ray.exceptions.RayError:
            pass  # the actor is gone, and its worker with it

    def close(self) -> None:
        """End the actor (its worker has exited): Ray frees its resources and its name."""
        try:
            self._ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if self._exit is not None and not self._exit.done():
            self._exit.cancel()
