"""WorkerNode: a worker's data-plane endpoint. PLACEHOLDER interface, replaced by the data-plane issue."""

from __future__ import annotations

from typing import Mapping

from stages.base import Stage
from supervisor.worker_spec import WorkerSpec


class WorkerNode:
    """Serves the data plane for the stages of one worker process.

    Interface the worker process relies on: construct, `await start()` (binds
    spec.address), `await stop(grace)` (drains, then closes).
    """

    def __init__(self, spec: WorkerSpec, stages: Mapping[str, Stage]) -> None:
        self.spec = spec
        self.stages = dict(stages)
        self._server = None

    async def start(self) -> None:
        import grpc

        self._server = grpc.aio.server()
        self._server.add_insecure_port(self.spec.address)
        await self._server.start()

    async def stop(self, grace: float) -> None:
        if self._server is not None:
            await self._server.stop(grace)
