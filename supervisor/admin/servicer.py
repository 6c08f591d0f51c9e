"""The admin API: the stagevisor.v1.Admin servicer (endpoints.py binds the gRPC servers it is served on).

The servicer reads a daemon through a small interface (`AdminDaemon`), so
unit tests drive it with a fake; supervisor/service.py wires it to the
real Daemon. Topology, status and the metrics summary travel as the typed
reports of supervisor/reports/, which own their proto conversion.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Protocol

import grpc

from stagevisor.supervisor._proto import admin_pb2, admin_pb2_grpc
from stagevisor.supervisor.errors import (
    DaemonError,
    ErrorCode,
    StagevisorError,
    WorkerStartError,
    shown,
)
from stagevisor.supervisor.config.voices import VoiceNamesChange
from stagevisor.supervisor.placement.diff import TopologyDiff
from stagevisor.supervisor.placement.request import PlacementRequest
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.reports import StatusReport, SummaryReport, TopologyReport
from stagevisor.supervisor.daemon.lifecycle import GroupState, LifecycleEvent


ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
HISTORY_HEADER = "stagevisor-history"
"""WatchEvents request metadata: "1" asks for the daemon's recent lifecycle events before the live ones."""
REPLAYED_HEADER = "stagevisor-replayed"
"""WatchEvents response header: how many of the first events are recent history, not new."""


# -- the servicer ------------------------------------------------------------

REFUSALS = (StagevisorError, DaemonError)
"""What a scale, an apply or a restart is refused with: FAILED_PRECONDITION, the operator's message
(`refusal`). A worker that fails to start is INTERNAL instead, said per RPC."""


def refusal(error: StagevisorError | DaemonError) -> str:
    """The FAILED_PRECONDITION message of a refused scale, apply or restart: a StagevisorError (a PlacementError, a
    ConfigError) with its code first, which the CLI reads back; a DaemonError (the daemon is not serving) as is."""
    return f"{error.code.value}: {error.message}" if isinstance(error, StagevisorError) else str(error)


class AdminDaemon(Protocol):
    """What the admin servicer needs from the daemon (supervisor/daemon/core.py's Daemon)."""

    def topology(self) -> TopologyReport: ...

    def status(self) -> StatusReport: ...

    def metrics_summary(self) -> SummaryReport:
        """What `stagevisor top` shows: per group resources and in flight, per stage recent latency."""

    def group_names(self) -> list[str]: ...

    def group_state(self, name: str) -> GroupState:
        """The group's state; KeyError for an unknown group."""

    async def restart_group(self, name: str, *, force: bool = False) -> tuple[int, int]: ...

    def restarted_state(self, name: str, pid: int) -> GroupState:
        """The state of the worker a restart of `name` started as `pid`; KeyError when an apply retired the group."""

    async def scale_group(self, name: str, replicas: int) -> tuple[int, int, list[str]]:
        """Run `replicas` workers of a group; PlacementError when refused, KeyError for an unknown group."""

    async def apply_request(
        self, request: PlacementRequest, *, dry_run: bool = False
    ) -> tuple[Plan, TopologyDiff, VoiceNamesChange | None]:
        """Plan `request` with the `plan` rules and move to that plan live (or only compare, with dry_run): the plan,
        the difference, and with a config the change of its `voices` map (taken too); StagevisorError or DaemonError
        when refused (nothing changed; counted as such)."""

    def request_shutdown(self, grace: float | None = None) -> float: ...

    def subscribe(self, history: bool = False) -> asyncio.Queue[LifecycleEvent | None]:
        """Events from now on (with `history`, the recent ones first); None marks the end of the stream."""

    def unsubscribe(self, queue: asyncio.Queue[LifecycleEvent | None]) -> None: ...


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """stagevisor.v1.Admin over a daemon; errors are `context.abort(code, operator message)`."""

    def __init__(self, daemon: AdminDaemon) -> None:
        self.daemon = daemon

    async def GetTopology(
        self, request: admin_pb2.GetTopologyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Topology:
        return self.daemon.topology().to_proto()

    async def GetStatus(
        self, request: admin_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.Status:
        return self.daemon.status().to_proto()

    async def RestartGroup(
        self, request: admin_pb2.RestartGroupRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.RestartGroupResponse:
        # A name the daemon does not run now may be a group an apply or a scale in progress adds: the restart
        # waits for that change, as any restart issued meanwhile does, and only then is the name unknown.
        known_before = request.name in self.daemon.group_names()
        try:
            old_pid, new_pid = await self.daemon.restart_group(request.name, force=request.force)
        except KeyError:
            known = ", ".join(self.daemon.group_names())
            if not known_before:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND, f"no process group {shown(request.name)}; known groups: {known}"
                )
            await context.abort(  # a scale or an apply that ran first removed the replica
                grpc.StatusCode.NOT_FOUND,
                f"process group {shown(request.name)} was removed by a scale or an apply while the restart waited "
                f"for it; known groups: {known}",
            )
        except REFUSALS as error:  # not serving, or its GPU cannot hold a second worker beside it
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        except WorkerStartError as error:
            where = f" (stage {error.stage!r})" if error.stage else ""
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"group {request.name!r} failed to restart{where}: {error.message}; {error.advice}",
            )
        try:
            # The restarted worker's, not the group's: a scale that ran right after may be starting replicas.
            state = self.daemon.restarted_state(request.name, new_pid).value
        except KeyError:  # an apply switched topology meanwhile: the worker restarted here was retired with the rest
            state = GroupState.STOPPED.value
        return admin_pb2.RestartGroupResponse(name=request.name, old_pid=old_pid, new_pid=new_pid, state=state)

    async def ScaleGroup(
        self, request: admin_pb2.ScaleGroupRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ScaleGroupResponse:
        waited_for = request.name in self.daemon.group_names()
        try:
            old, new, workers = await self.daemon.scale_group(request.name, request.replicas)
        except REFUSALS as error:
            known = self.daemon.group_names()
            if waited_for and request.name not in known:  # an apply that ran first merged or renamed the group
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{ErrorCode.MISSING_PROCESS.value}: process group {shown(request.name)} was removed by an apply "
                    f"while the scale waited for it; known groups: {', '.join(known)}",
                )
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        except WorkerStartError as error:
            where = f" (stage {error.stage!r})" if error.stage else ""
            await context.abort(
                grpc.StatusCode.INTERNAL,
                f"a new replica of group {request.name!r} failed to start{where}: {error.message}; "
                "the group keeps its replicas, see `stagevisor status`",
            )
        # No await since the scale: the topology is the one it left.
        pids = _worker_pids(self.daemon.topology(), request.name)
        return admin_pb2.ScaleGroupResponse(
            name=request.name,
            old_replicas=old,
            new_replicas=new,
            workers=workers,
            pids=[pids.get(name) or 0 for name in workers],
        )

    async def Apply(
        self, request: admin_pb2.ApplyRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ApplyResponse:
        if request.HasField("config_path") and not request.HasField("config_text"):
            # The daemon does not read a config file a client names: it may read what the client cannot, and a parse
            # error would quote it back.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "Apply takes the config's YAML in config_text; config_path only names it in messages (the daemon "
                "reads no config file a client names): `stagevisor apply --config FILE` sends the file's text",
            )
        placement = PlacementRequest(
            model_path=request.model_path if request.HasField("model_path") else None,
            config_path=request.config_path if request.HasField("config_path") else None,
            config_text=request.config_text if request.HasField("config_text") else None,
            isolate_stages=tuple(request.isolate_stages),
            stage_processes=tuple(request.stage_processes),
            process_replicas=tuple(request.process_replicas),
        )
        try:
            plan, diff, voices = await self.daemon.apply_request(placement, dry_run=request.dry_run)
        except REFUSALS as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal(error))
        return admin_pb2.ApplyResponse(
            changed=diff.changed,
            applied=diff.changed and not request.dry_run,
            diff_json=json.dumps(diff.to_json()),
            plan_json=json.dumps(plan.to_json()),
            voices_json="" if voices is None else json.dumps(voices.to_json()),
        )

    async def Shutdown(
        self, request: admin_pb2.ShutdownRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ShutdownResponse:
        grace = request.grace_seconds if request.HasField("grace_seconds") else None
        if grace is not None and grace < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"grace must be >= 0 seconds, got {grace:g}")
        return admin_pb2.ShutdownResponse(deadline_seconds=self.daemon.request_shutdown(grace))

    async def GetMetricsSummary(
        self, request: admin_pb2.GetMetricsSummaryRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.MetricsSummary:
        return self.daemon.metrics_summary().to_proto()

    async def WatchEvents(
        self, request: admin_pb2.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[admin_pb2.LifecycleEvent]:
        # A client that asks (metadata `stagevisor-history: 1`) gets the recent events first; the
        # header `stagevisor-replayed` says how many of the first events are such history.
        history = dict(context.invocation_metadata() or ()).get(HISTORY_HEADER) == "1"
        queue = self.daemon.subscribe(history)
        # Also when the call ends, not only in this generator's `finally`: a watcher that stopped reading and then
        # went away leaves the generator suspended at a write until the garbage collector finalizes it.
        context.add_done_callback(lambda _: self.daemon.unsubscribe(queue))
        replayed = queue.qsize() if history else 0  # (one more than sent when the daemon already stopped: harmless)
        try:
            # Headers go out once subscribed: a client that waits for them misses no event after.
            await context.send_initial_metadata(((REPLAYED_HEADER, str(replayed)),))
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield admin_pb2.LifecycleEvent(
                    group=event.group,
                    old_state=event.old_state.value,
                    new_state=event.new_state.value,
                    pid=event.pid,
                    reason=event.reason,
                    time=event.time,
                    kind=event.kind,
                )
        finally:
            self.daemon.unsubscribe(queue)


def _worker_pids(topology: TopologyReport, group: str) -> dict[str, int | None]:
    """Worker name -> pid of `group`'s workers in `topology`: each replica's, or the single worker's under the
    group's name."""
    for report in topology.groups:
        if report.name == group:
            if report.workers:
                return {worker.name: worker.pid for worker in report.workers}
            return {report.name: report.pid}
    return {}
