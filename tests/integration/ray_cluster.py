"""A local multi-node Ray cluster for the `--launcher ray` tests (Ray's own ray.cluster_utils.Cluster).

Small on purpose (the suite runs on 2 shared cores): one CPU per node, no
dashboard, a small object store, and Ray's files in a private directory that
is removed with the cluster. Nodes are told apart by custom resources, which
is what a group's `node:` names.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Iterator

OBJECT_STORE = 80 * 1024 * 1024
"""Bytes of each node's object store: Ray's floor is 75 MiB; stagevisor puts nothing there."""
HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                 "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}
NODE_A = "sv-node-a"
NODE_B = "sv-node-b"
SPARE = "sv-spare"
"""A resource two nodes hold: a group pinned to it can move when one of them goes away."""


class LocalCluster:
    """A head node (NODE_A) and a second node (NODE_B, SPARE), each with one CPU and one logical GPU.

    The GPUs are Ray resources only (Ray's own tests do the same): GPU groups are placed by their share
    and, with no CUDA here, run on CPU, as with the local launcher.
    """

    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.ray = ray
        # Short and private: Ray's sockets live under it (unix socket paths are limited to 107 bytes).
        self.tmp = tempfile.mkdtemp(prefix="svray", dir="/tmp")
        self._saved = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = self.tmp  # daemons started by the tests inherit it
        # A node killed outright is declared dead after about 2 s (Ray's default: about 30 s), so a test
        # that removes one sees its groups move within bounded waits.
        head = {**self._args({NODE_A: 1}), "_system_config": HEALTH_CHECKS}
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.nodes: dict[str, Any] = {NODE_A: self.cluster.head_node}
        self.nodes[NODE_B] = self.cluster.add_node(**self._args({NODE_B: 1, SPARE: 1}))
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, namespace="stagevisor-tests", log_to_driver=False,
                 configure_logging=False)

    @staticmethod
    def _args(resources: dict[str, float], gpus: int = 1) -> dict[str, Any]:
        return {"num_cpus": 1, "num_gpus": gpus, "resources": resources, "include_dashboard": False,
                "object_store_memory": OBJECT_STORE}

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self, name: str, resources: dict[str, float], gpus: int = 1) -> None:
        self.nodes[name] = self.cluster.add_node(**self._args(resources, gpus))
        self.cluster.wait_for_nodes()

    def remove_node(self, name: str) -> None:
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def node_ids(self) -> dict[str, str]:
        """Custom resource -> id of the alive node that holds it (SPARE: the last one listed)."""
        ids = {}
        for entry in self.ray.nodes():
            if entry.get("Alive"):
                for resource in entry.get("Resources", {}):
                    if resource.startswith("sv-"):
                        ids[resource] = entry["NodeID"]
        return ids

    def stagevisor_actors(self, prefix: str = "stagevisor-") -> list[str]:
        """Names of the live actors in the `stagevisor` namespace that start with `prefix`."""
        return sorted(entry["name"] for entry in self.ray.util.list_named_actors(all_namespaces=True)
                      if entry["namespace"] == "stagevisor" and entry["name"].startswith(prefix))

    def close(self) -> None:
        try:
            self.ray.shutdown()
            self.cluster.shutdown()
        finally:
            if self._saved is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = self._saved
            shutil.rmtree(self.tmp, ignore_errors=True)


def local_cluster() -> Iterator[LocalCluster]:
    """The body of a module-scoped fixture: one cluster for every test of the module."""
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.close()
