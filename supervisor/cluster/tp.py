"""Tensor-parallel ranks under `--launcher ray`: one placement group per TP stage, its ranks kept on one node.

Each TP stage gets a Ray placement group (strategy TP_STRATEGY, STRICT_PACK)
with one bundle per rank (supervisor/cluster/resources.py: tp_bundles): a whole GPU
each, plus a sliver of the stage's `node:` when it is pinned. Rank
i's actor is scheduled into bundle i, so every rank lands on the same node,
each on its own GPU.

A TP rank must see every rank's GPU, in rank order, with its own at index
tp_rank (supervisor/worker/spec.py: group_gpus); Ray gives each actor only its
own. So a rank's actor starts deferred: it reports the GPU Ray gave it
(`devices`), waits here until every rank of its stage on the same node has
reported, and starts its worker seeing all of them (`launch`).

The placement group belongs to the daemon's Ray job like the actors: Ray
removes it when the daemon stops or dies. When its node goes away, Ray places
it again on a node that fits, and the ranks, restarted by the daemon, follow.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from stagevisor.supervisor.cluster.resources import TP_STRATEGY, tp_bundles, tp_placement_name
from stagevisor.supervisor.plan import ProcessGroup


class TpGang:
    """The placement group of one TP stage and the GPUs its ranks' actors were given (on the daemon's loop)."""

    def __init__(self, ray: Any, daemon: str, stage: str, ranks: Sequence[ProcessGroup], per_gpu_limit: float) -> None:
        self.stage = stage
        self.size = len(ranks)
        self.bundles = tp_bundles(ranks, per_gpu_limit)
        self.name = tp_placement_name(daemon, stage)
        self._ray = ray
        self.placement = ray.util.placement_group(self.bundles, strategy=TP_STRATEGY, name=self.name)
        self._devices: dict[int, tuple[str, str]] = {}
        """rank -> (node id, CUDA_VISIBLE_DEVICES Ray gave its actor), as last reported."""
        self._changed: asyncio.Condition | None = None

    def scheduling(self, rank: int) -> Any:
        """The scheduling strategy of rank `rank`'s actor: bundle `rank` of the placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=rank)

    def visible(self, node_id: str) -> str | None:
        """Every rank's GPUs in rank order when all have reported from `node_id`; None until then. Pure."""
        if len(self._devices) < self.size or any(self._devices[r][0] != node_id for r in range(self.size)):
            return None
        return ",".join(self._devices[r][1] for r in range(self.size))

    async def gather(self, rank: int, node_id: str, devices: str, timeout: float) -> str:
        """Note what rank `rank` was given; wait (at most `timeout` s) for the others on its node; their GPUs.

        asyncio.TimeoutError when some rank has not reported from that node in time.
        """
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            self._devices[rank] = (node_id, devices)
            self._changed.notify_all()
            if self.visible(node_id) is not None:  # the last to report: no wait (even with no time left)
                return self.visible(node_id) or ""
            await asyncio.wait_for(self._changed.wait_for(lambda: self.visible(node_id) is not None), timeout)
            return self.visible(node_id) or ""

    def missing(self, node_id: str) -> list[int]:
        """The ranks that have not reported from `node_id`."""
        return [r for r in range(self.size) if self._devices.get(r, ("", ""))[0] != node_id]

    def remove(self) -> None:
        """Free the placement group now (it also goes with the daemon's job)."""
        try:
            self._ray.util.remove_placement_group(self.placement)
        except Exception:  # noqa: BLE001 - already gone with its job
            pass
