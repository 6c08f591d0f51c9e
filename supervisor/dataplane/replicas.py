"""ReplicaRouter: which replica of a replicated process group a sender's next request goes to.

A replicated group keeps one address in `routes` (its first replica's, the
group's address); the router maps it to the addresses of the replicas that
take new requests (the daemon pushes that set whenever a replica changes
state) and picks the one with the fewest requests this sender has in flight
there. Senders remember the pick per request and group, so every frame of a
request for that group reaches the same replica; they `release` it when the
request ends. Groups the router does not know (a single worker) are routed
exactly as before: the address in `routes`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Mapping

RECENT_ROUTES = 8192
"""(request, replica) picks remembered after the request left the sender, to fail them if that replica dies."""


class ReplicaRouter:
    """Least-in-flight choice among the READY replicas of each replicated group, as one sender sees it."""

    def __init__(self, replicas: Mapping[str, Iterable[str]] | None = None) -> None:
        self.groups: dict[str, tuple[str, ...]] = {}
        """Group address -> the addresses of its replicas that take new requests."""
        self.known: dict[str, str] = {}
        """Every replica address ever announced -> its group address."""
        self.in_flight: dict[str, int] = {}
        """Replica address -> requests this sender routed there that have not ended."""
        self._turn = 0
        self._last: dict[str, int] = {}
        self.recent: OrderedDict[tuple[str, str], bool] = OrderedDict()
        """(request id, replica address) of recent picks, newest last, bounded by RECENT_ROUTES -> whether the pick
        was the group's own address for want of a replica taking requests (a fallback)."""
        self.retired: set[str] = set()
        """Replicas the daemon took out of rotation (announced, then left out of a later announcement) and has not
        put back: it stops them on purpose, and a stopping worker fails what it still holds itself."""
        self._announced: dict[str, tuple[str, ...]] = {}
        for address, members in (replicas or {}).items():
            self.set_ready(address, members)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def set_ready(self, address: str, ready: Iterable[str]) -> set[str]:
        """The replicas of the group at `address` that take new requests (empty: none does now). Returns those back
        in rotation after the daemon took them out: a new worker at each one's address."""
        members = tuple(ready)
        self.retired |= set(self._announced.get(address, ())) - set(members)
        back = self.retired & set(members)
        for member in back:
            # Back in rotation: a new worker at the old one's address. The old one ended, having answered what it
            # held or been reported lost; its picks kept for that (StageRuntime.on_link_broken) now go, so that the
            # new worker's loss fails none of the old one's requests.
            self.forget(member)
        self.retired -= set(members)
        self._announced[address] = members
        self.groups[address] = members
        self.known[address] = address
        for member in members:
            self.known[member] = address
            self.in_flight.setdefault(member, 0)
        return back

    def mark_down(self, replica: str) -> None:
        """Take a replica out of its group's rotation until the daemon announces it again."""
        group = self.known.get(replica)
        if group is not None and replica in self.groups.get(group, ()):
            self.groups[group] = tuple(a for a in self.groups[group] if a != replica)

    def group_of(self, replica: str) -> str | None:
        return self.known.get(replica)

    def choose(self, address: str, request_id: str) -> str:
        """The replica of the group at `address` for a new request: READY, fewest in flight, least recently used.

        With no replica ready the group's own address is used, so the request
        fails the way it would for a single worker that is down (UNAVAILABLE).
        """
        members = self.groups.get(address)
        if not members:
            # Counted and remembered as any pick: a worker may answer there (the group's first replica, back),
            # and the request's release must not take another request's count there.
            best = address
            self.in_flight[address] = self.in_flight.get(address, 0) + 1
        else:
            self._turn += 1
            last = self._last
            inflight = self.in_flight
            best = min(members, key=lambda a: (inflight.get(a, 0), last.get(a, 0)))
            last[best] = self._turn
            inflight[best] = inflight.get(best, 0) + 1
        recent = self.recent
        recent[(request_id, best)] = not members
        if len(recent) > RECENT_ROUTES:
            recent.popitem(last=False)
        return best

    def release(self, replica: str) -> None:
        """A request routed to `replica` ended in this sender."""
        count = self.in_flight.get(replica, 0)
        if count > 0:
            self.in_flight[replica] = count - 1

    def routed_to(self, replica: str, *, fallbacks_only: bool = False) -> list[str]:
        """Requests recently routed to `replica` (held or already handed on), oldest first; `replica` may be a
        group's own address, where requests go while none of its replicas takes them (`fallbacks_only`: only
        those)."""
        return [
            request
            for (request, address), fallback in self.recent.items()
            if address == replica and (fallback or not fallbacks_only)
        ]

    def picks_by_replica(self) -> dict[str, list[str]]:
        """Every recent pick, by replica address (requests oldest first): what a sender that stops tells the
        gateway, for from then on no one else knows where those requests went."""
        picks: dict[str, list[str]] = {}
        for request, address in self.recent:
            picks.setdefault(address, []).append(request)
        return picks

    def forget(self, replica: str, *, fallbacks_only: bool = False) -> None:
        """Drop the recent picks of a replica (after its requests were failed; `fallbacks_only`: only those routed
        to a group's own address for want of a replica taking requests)."""
        picks = [key for key, fallback in self.recent.items() if key[1] == replica and (fallback or not fallbacks_only)]
        for key in picks:
            del self.recent[key]
