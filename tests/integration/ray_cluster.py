"""A local multi-node Ray cluster for the `--launcher ray` tests (Ray's own ray.cluster_utils.Cluster).

Small on purpose (the suite runs on 2 shared cores): one CPU per node, no
dashboard, a small object store, and Ray's files in a private directory that
is removed with the cluster. Nodes are told apart by custom resources, which
is what a group's `node:` names.

Ray gives each node 30 s (a constant in ray._private.node) to register, and a
raylet registers only once its Python dashboard agent has imported. Beside the
suite's other xdist worker that import once took longer, so a start that times
out is torn down and tried again (START_ATTEMPTS), and the last failure shows
the tails of Ray's own logs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from typing import Any, Iterator

import psutil

OBJECT_STORE = 80 * 1024 * 1024
"""Bytes of each node's object store: Ray's floor is 75 MiB; stagevisor puts nothing there."""
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 3000,
    "health_check_failure_threshold": 8,
}
"""A removed node (its raylet gone: each check fails at once) is declared dead after about 8 s (Ray's default:
about 30 s); a live node busy with the suite's other work has 3 s to answer each check. Shorter was too short:
1.5 s in all declared a node just added dead while alive, and so did five checks of 1 s each, the second node of
test_a_lost_node_under_load... while the suite's other worker kept both cores busy (the group then had nowhere
to move)."""
START_ATTEMPTS = 3
RAY_LOG_TAILS = ("gcs_server.out", "raylet*.out", "raylet*.err", "dashboard_agent*.log", "runtime_env_agent*.log")
"""Ray's logs (one per node where a pattern) whose last lines a failed start shows."""
NODE_A = "sv-node-a"
NODE_B = "sv-node-b"
SPARE = "sv-spare"
"""A resource two nodes hold: a group pinned to it can move when one of them goes away."""


def _start_timed_out(exc: Exception) -> bool:
    """Whether a node's start gave up waiting for one of its processes: "... timed out during startup", or, for a
    GCS server starved of CPU (CI's newcomer lane at a load average of 10), "Timed out waiting for file
    .../gcs_server_port_...". Either may pass on a second try; any other error would not."""
    message = str(exc)
    return "timed out during startup" in message or message.startswith("Timed out waiting for file")


class LocalCluster:
    """A head node (NODE_A) and a second node (NODE_B, SPARE), each with one CPU and one logical GPU.

    The GPUs are Ray resources only (Ray's own tests do the same): GPU groups are placed by their share
    and, with no CUDA here, run on CPU, as with the local launcher.
    """

    def __init__(self) -> None:
        import ray
        from ray.cluster_utils import Cluster

        self.ray = ray
        self._saved = os.environ.get("RAY_TMPDIR")
        for attempt in range(1, START_ATTEMPTS + 1):
            # Short and private: Ray's sockets live under it (unix socket paths are limited to 107 bytes).
            self.tmp = tempfile.mkdtemp(prefix="svray", dir="/tmp")
            os.environ["RAY_TMPDIR"] = self.tmp  # daemons started by the tests inherit it
            self.cluster = Cluster(initialize_head=False)
            try:
                self._start()
                return
            except Exception as exc:
                if not _start_timed_out(exc) or attempt == START_ATTEMPTS:
                    logs = self._log_tails()
                    self.close()
                    raise RuntimeError(
                        f"the local Ray cluster did not start (attempt {attempt} of {START_ATTEMPTS}): {exc}\n{logs}"
                    ) from exc
                self.close()

    def _start(self) -> None:
        # A node killed outright is declared dead within seconds (HEALTH_CHECKS), so a test that removes
        # one sees its groups move within bounded waits. A copy: Ray writes the node's object-spilling
        # directory into the dict it is given.
        self.nodes: dict[str, Any] = {
            NODE_A: self.cluster.add_node(**self._args({NODE_A: 1}), _system_config=dict(HEALTH_CHECKS))
        }
        self.nodes[NODE_B] = self.cluster.add_node(**self._args({NODE_B: 1, SPARE: 1}))
        self.cluster.wait_for_nodes()
        self.ray.init(
            address=self.cluster.address, namespace="stagevisor-tests", log_to_driver=False, configure_logging=False
        )

    def _log_tails(self, lines: int = 15) -> str:
        tails = []
        for name in RAY_LOG_TAILS:
            for path in sorted(glob.glob(os.path.join(self.tmp, "ray", "session_2*", "logs", name))):
                with open(path, errors="replace") as handle:
                    tails.append(f"--- {path}\n" + "".join(handle.readlines()[-lines:]))
        return "\n".join(tails) or f"(no Ray logs under {self.tmp})"

    @staticmethod
    def _args(resources: dict[str, float], gpus: int = 1) -> dict[str, Any]:
        return {
            "num_cpus": 1,
            "num_gpus": gpus,
            "resources": resources,
            "include_dashboard": False,
            "object_store_memory": OBJECT_STORE,
        }

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
        return sorted(
            entry["name"]
            for entry in self.ray.util.list_named_actors(all_namespaces=True)
            if entry["namespace"] == "stagevisor" and entry["name"].startswith(prefix)
        )

    def close(self) -> None:
        try:
            self.ray.shutdown()
            self.cluster.shutdown()
        finally:
            self._kill_strays()
            if self._saved is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = self._saved
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _kill_strays(self) -> None:
        """Kill what Ray started under this cluster's directory and outlived its shutdown.

        A node whose start timed out is not in the Cluster's list, so cluster.shutdown() leaves its GCS,
        raylet and agents running; each names the directory on its command line.
        """
        strays = set()
        for process in psutil.process_iter(["cmdline"]):
            if any(self.tmp in arg for arg in process.info["cmdline"] or ()):
                strays.add(process)
                with contextlib.suppress(psutil.NoSuchProcess):
                    strays.update(process.children(recursive=True))  # agents and workers rename themselves
        for process in strays:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(strays, timeout=10)


def local_cluster() -> Iterator[LocalCluster]:
    """The body of a module-scoped fixture: one cluster for every test of the module."""
    cluster = LocalCluster()
    try:
        yield cluster
    finally:
        cluster.close()
