"""Gateway: the daemon's side of the data plane. PLACEHOLDER interface, replaced by the data-plane issue."""

from __future__ import annotations

from typing import Any, Mapping

from supervisor.plan import Plan


class Gateway:
    """Admits synthesis requests into the pipeline and collects what terminal stages stream back.

    Interface the daemon relies on: construct with the plan, the routes (stage ->
    worker data-plane address) and the daemon's own data-plane address (the
    sink); `await start()`; `add_to_server(server)` registers the
    stagevisor.v1.Synthesis service on the daemon's public gRPC server;
    `fail_group(name, reason)` ends every in-flight request that touches a
    worker that died with UNAVAILABLE; `in_flight()` counts requests for
    draining; `edge_transports()` reports what each edge actually used;
    `await stop(grace)`.
    """

    def __init__(self, plan: Plan, routes: Mapping[str, str], sink_address: str) -> None:
        self.plan = plan
        self.routes = dict(routes)
        self.sink_address = sink_address

    async def start(self) -> None:
        return None

    def add_to_server(self, server: Any) -> None:
        return None

    def fail_group(self, group: str, reason: str) -> None:
        return None

    def in_flight(self) -> int:
        return 0

    def edge_transports(self) -> dict[tuple[str, str], str]:
        return {}

    async def stop(self, grace: float) -> None:
        return None
