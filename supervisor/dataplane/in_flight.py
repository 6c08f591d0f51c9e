"""The gateway's requests in flight and the workers that hold them: failing them as workers come and go.

Replica sets announced and lost, workers leaving, links breaking, groups down: what `gateway.Gateway` (which
subclasses `InFlight`, so each is the same method call as before) does with the requests they held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.client_failures import (
    MAX_ECHOED_CHARS,
    group_down,
    public_code,
    public_failure,
    replica_down,
    worker_unreachable,
)
from stagevisor.supervisor.dataplane.link.outbound import LinkPool, out_of_descriptors
from stagevisor.supervisor.dataplane.reach import groups_by_address, reachable
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.errors import clipped
from stagevisor.supervisor.plan import Plan

# Logged under the gateway's name, as before this module was split out of it.
log = logging.getLogger("stagevisor.supervisor.dataplane.gateway")


class InFlight:
    """The requests in flight at the gateway, and what fails them when a worker, a replica or a group goes away.

    Subclassed by `Gateway`, which admits the requests and owns the shared-memory area (`sweep_shared`).
    """

    def __init__(self, plan: Plan, routes: Mapping[str, str]) -> None:
        self.plan = plan
        self.routes = dict(routes)
        self.entry = plan.stages[0].name
        reached = reachable(plan, self.entry)
        self.route_addresses = sorted({self.routes[s] for s in reached if s in self.routes})
        """The addresses of every worker a request may reach (each request's route is all of them)."""
        self._groups_at = groups_by_address(plan, self.routes, reached)
        self.requests: dict[str, RequestHandle] = {}
        """The requests in flight, by id: admitted and not yet closed."""
        self.links: LinkPool | None = None
        """The gateway's links to its workers (they carry submissions, cancels, Peers and Replicas frames) once
        started."""
        self.router = ReplicaRouter()
        """READY replicas of replicated groups (the daemon's `push_replicas`); empty when none is replicated."""
        self._replicas_version = 0
        self._acks: dict[str, int] = {}
        self._lost: set[str] = set()
        """Replicas reported lost that no new worker has taken since: a request reported handed on to one fails."""

    def sweep_shared(self) -> int:
        """Remove shared buffers of workers that are gone; return how many (the Gateway, which owns the area)."""
        raise NotImplementedError

    # ---- requests in flight -----------------------------------------------------

    def cancel_everywhere(self, request_id: str, reason: str) -> None:
        if self.links is None:
            return
        addresses = self.route_addresses
        if self.router:  # every replica: the gateway does not know which one a worker chose
            addresses = [*addresses, *(a for a in self.router.known if a not in self.routes.values())]
        for address in addresses:
            try:
                self.links.send_if_linked(address, pb.Frame(request_id=request_id, cancel=pb.Cancel(reason=reason)))
            except Exception:  # noqa: BLE001 - a dead worker has nothing left to cancel
                log.debug("cancel to %s not sent", address, exc_info=True)

    def in_flight(self) -> int:
        """Requests admitted and not yet closed (for draining on SIGTERM)."""
        return len(self.requests)

    def fail_group(self, group: str, reason: str) -> None:
        """End every in-flight request whose route touches `group` with UNAVAILABLE naming the group."""
        try:
            stages = self.plan.group(group).stages
        except KeyError:
            return
        addresses = {self.routes[s] for s in stages if s in self.routes}
        if addresses & set(self.route_addresses):
            self._fail_all(group_down(stages, group, reason), stage=stages[0] if len(stages) == 1 else "")
        self.sweep_shared()

    # ---- replicas -------------------------------------------------------------------

    def push_replicas(
        self,
        sets: Mapping[str, tuple[str, ...]],
        lost: tuple[str, ...],
        workers: Mapping[str, str],
        names: Mapping[str, str] | None = None,
    ) -> int:
        """Announce which replicas take new requests (`sets`: group address -> READY replicas) and which died.

        Applied here at once; sent to every worker in `workers` (name -> address)
        as a Replicas frame, which each answers with the version this returns
        (`wait_replicas`). Requests the gateway sent to a lost replica fail now;
        workers fail those they routed there.
        """
        self._replicas_version += 1
        message = pb.Replicas(version=self._replicas_version, lost=list(lost), names=dict(names or {}))
        for address, ready in sets.items():
            if address not in self.router.groups:
                self._pin_in_flight(address)
            back = self.router.set_ready(address, ready)
            if back:
                self._forget_handed_to(back)
                self._lost -= back
            message.sets.add(address=address, ready=list(ready))
        for replica in lost:
            self.replica_lost(replica)
        if self.links is not None:
            frame = pb.Frame(replicas=message)
            for address in workers.values():
                try:
                    self.links.send(address, frame)
                except Exception:  # noqa: BLE001 - a worker that is gone learns the state when it is READY again
                    log.debug("replicas frame to %s not sent", address, exc_info=True)
        return self._replicas_version

    def _pin_in_flight(self, address: str) -> None:
        """The entry group at `address` gets replicas: the requests sent to its one worker until now count as
        held by the replica at that address (that worker's), so a drain of it waits for them as for requests
        routed to it from now on."""
        if self.routes.get(self.entry) != address:
            return  # the gateway sends requests to the entry only; senders pin what they sent to other groups
        for handle in self.requests.values():
            if handle.replica is None and not handle.ended:
                handle.replica = address
                self.router.in_flight[address] = self.router.in_flight.get(address, 0) + 1

    def _forget_handed_to(self, replicas: set[str]) -> None:
        """New workers took these replicas' addresses: the old ones ended, having answered or failed what they
        held (or been reported lost), so the loss of a new one fails none of the requests handed to an old one."""
        for handle in self.requests.values():
            if handle.handed_to & replicas:
                handle.handed_to -= replicas

    def take_handed_on(self, handed_on: pb.HandedOn) -> None:
        """A stopping worker says where it routed requests among replicas: watch those still in flight there, or
        fail them now where that replica was lost before the report came (none is left to fail them later)."""
        replica = handed_on.replica
        held = [self.requests.get(request_id) for request_id in handed_on.request_ids]
        for handle in (h for h in held if h is not None and not h.ended):
            handle.handed_to |= {replica}
        if replica in self._lost:
            self._fail_held_by(replica)

    async def wait_replicas(self, version: int, workers: Mapping[str, str], timeout: float) -> list[str]:
        """Wait until every worker answered `version`; return the names that did not within `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            missing = [name for name in workers if self._acks.get(name, 0) < version]
            if not missing or loop.time() >= deadline:
                return missing
            await asyncio.sleep(0.01)

    def request_ids(self) -> frozenset[str]:
        """The requests in flight now, whatever worker holds them (a restart waits for those its old worker may)."""
        return frozenset(self.requests)

    def replica_in_flight(self, replica: str) -> int:
        """Requests the gateway sent to this replica (of the entry group) that have not ended."""
        return self.router.in_flight.get(replica, 0)

    def replica_lost(self, replica: str) -> None:
        """A replica's worker died: fail the requests sent to it (by the gateway, or by a worker that has stopped
        since), route new ones elsewhere."""
        self.router.mark_down(replica)
        self._lost.add(replica)
        self._fail_held_by(replica)
        self.sweep_shared()

    def _fail_held_by(self, replica: str) -> None:
        """Fail the requests in flight that the lost `replica` held: sent there by the gateway or reported handed on."""
        group = self.router.group_of(replica) or replica
        stages = sorted(s for s, a in self.routes.items() if a == group)
        message = replica_down(stages)
        for handle in list(self.requests.values()):
            held = handle.replica == replica or replica in handle.handed_to
            if held and handle.fail("UNAVAILABLE", message, stages[0] if len(stages) == 1 else ""):
                self.cancel_everywhere(handle.request_id, message)

    def _fail_all(self, message: str, stage: str = "") -> None:
        # Every request's route is the whole reachable pipeline, so all in-flight requests touch it.
        for handle in list(self.requests.values()):
            if handle.fail("UNAVAILABLE", message, stage):
                self.cancel_everywhere(handle.request_id, message)

    # ---- replies and broken links ----------------------------------------------

    def on_reply(self, frame: pb.Frame) -> None:
        """A worker's frame on the gateway's link to it (the LinkPool's `on_reply`): a Replicas answer, or Leaving."""
        body = frame.WhichOneof("body")
        if body == "replicas":  # a worker took in a Replicas frame
            self._acks[frame.src] = max(self._acks.get(frame.src, 0), frame.replicas.version)
            return
        if body == "leaving":  # a worker stops: what it still held fails now, in its words (the link keeps the rest)
            failure = pb.Failure(code=pb.FAILURE_CODE_UNAVAILABLE, message=frame.leaving.message)
            status, message = public_failure(failure)
            for request_id in frame.leaving.failed:
                handle = self.requests.get(request_id)
                if handle is not None and handle.fail(status, message, code=public_code(failure)):
                    self.cancel_everywhere(request_id, clipped(failure.message, MAX_ECHOED_CHARS))
            return
        # Workers answer on the gateway's links only with Release frames, which the links take in.
        log.debug("ignoring a %s reply from a worker", frame.WhichOneof("body"))

    def on_link_broken(self, link: Any, error: BaseException) -> None:
        """The gateway's link to a worker broke (the LinkPool's `on_broken`): fail the requests it held."""
        address = self.router.group_of(link.address) or link.address
        descriptors = out_of_descriptors(error)
        if self.router and not descriptors:  # for want of descriptors here the replica is fine: kept in rotation
            self.router.mark_down(link.address)
        groups = self._groups_at.get(address, [link.address])
        stages = sorted(s for s, a in self.routes.items() if a == address)
        message = worker_unreachable(stages, groups, descriptors)
        for handle in list(self.requests.values()):
            if handle.request_id in link.left:  # its work there ended before the worker stopped: it goes on
                continue
            if link in handle.links and handle.fail("UNAVAILABLE", message, stages[0] if len(stages) == 1 else ""):
                self.cancel_everywhere(handle.request_id, message)
        self.sweep_shared()
