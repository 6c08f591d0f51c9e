"""Where a request's frames for a stage go: the stage's worker, or the replica of its group the request is pinned to.

The first frame of a request for a replicated group picks a replica
(replicas.ReplicaRouter, least in flight) and every later frame of that request
for the group goes to the same one, so a stream's chunks and end reach the
worker that holds the stream. The pins are given back when the request ends.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from stagevisor.supervisor.dataplane.peers import PeerDirectory
from stagevisor.supervisor.dataplane.replicas import ReplicaRouter
from stagevisor.supervisor.dataplane.request_state import RequestState
from stagevisor.supervisor.dataplane.trace import GRPC


class Addresses:
    """Stage -> worker address (`routes`), with each request's replica pins and the transport to each address."""

    def __init__(self, routes: Mapping[str, str], router: ReplicaRouter, directory: PeerDirectory | None) -> None:
        self.routes = dict(routes)
        self.router = router
        self.directory = directory

    def address(self, state: RequestState, dst: str) -> str:
        """Where frames of this request for stage `dst` go: its worker, or the replica chosen for its group."""
        address = self.routes[dst]
        groups = self.router.groups
        if not groups or address not in groups:  # no replicas: as before, one dict lookup more
            return address
        router = self.router
        chosen = state.replicas.get(address) if state.replicas is not None else None
        if chosen is None:
            chosen = router.choose(address, state.request_id)
            if state.replicas is None:
                state.replicas = {}
            state.replicas[address] = chosen
        return chosen

    def transport(self, address: str) -> str:
        """The hop label of a frame to `address`: `grpc` (unix, shared memory) or `grpc_tcp` (another node)."""
        return GRPC if self.directory is None else self.directory.transport(address)

    def release(self, state: RequestState) -> None:
        """Give back the replicas a request that ended was pinned to."""
        for replica in (state.replicas or {}).values():
            self.router.release(replica)
        state.replicas = None

    def pin_in_flight(self, address: str, states: Iterable[RequestState]) -> None:
        """A group at `address` gets replicas: requests that already sent it frames keep it for the rest.

        Until now its frames went to `address` without a pick (a single worker); a later frame of the same
        request (a stream's next chunk, its end) must reach the worker that holds the stream, not whichever
        replica is least busy once the group has several.
        """
        for state in states:
            if any(link.address == address for link in state.links):
                if state.replicas is None:
                    state.replicas = {}
                if address not in state.replicas:
                    state.replicas[address] = address
                    self.router.in_flight[address] = self.router.in_flight.get(address, 0) + 1

    def stages_at(self, address: str) -> list[str]:
        """The stages served at `address` (a replica counts as its group), for messages; the gateway if none."""
        group = self.router.group_of(address) or address
        return sorted(s for s, a in self.routes.items() if a == group) or ["the gateway"]
