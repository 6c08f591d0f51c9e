"""Joining the Ray cluster as the daemon's driver (`--launcher ray`, `plan --launcher ray`): its address checked first.

`serve` joins once, from the main thread before the daemon's loop, and stays
joined; RayLauncher.prepare (supervisor/cluster/launcher.py) joins off the loop.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from stagevisor.supervisor.addresses import host_port
from stagevisor.supervisor.cluster.resources import ClusterNode, alive_nodes, check_cluster
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.install import install_command
from stagevisor.supervisor.plan import Plan

NAMESPACE = "stagevisor"
CLUSTER_CONNECT_TIMEOUT = 5.0
"""Seconds for a TCP connection to an explicit cluster address before joining: at an address nothing answers,
Ray's driver retries for many minutes inside its C++ client, where Ctrl-C and SIGTERM wait for it."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise StagevisorError(
            ErrorCode.CLUSTER_UNREACHABLE,
            f"--launcher ray needs Ray on this host and every node: {install_command('ray')}",
        ) from None
    return ray


def unreachable(address: str, timeout: float = CLUSTER_CONNECT_TIMEOUT) -> str | None:
    """Why nothing takes a connection at a cluster address of the form `[ray://]host:port` (None: something does,
    or the address has another form, such as `auto`, which Ray resolves itself)."""
    target = host_port(address.removeprefix("ray://"))
    if target is None:
        return None
    try:
        with socket.create_connection(target, timeout=timeout):
            return None
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__


def connect(address: str | None) -> Any:
    """Join the cluster at `address` (None: RAY_ADDRESS, else a running local one) as a driver; return ray."""
    ray = import_ray()
    if not ray.is_initialized():
        target = address or os.environ.get("RAY_ADDRESS") or "auto"
        why = unreachable(target)
        if why is not None:
            raise StagevisorError(
                ErrorCode.CLUSTER_UNREACHABLE,
                f"cannot join the Ray cluster at {target} (--ray-address): nothing takes a connection there "
                f"({why}); start it (`ray start --head`) or give its address",
            )
        if not sys.stderr.isatty():
            # The workers' lines Ray forwards (log_to_driver) get colour codes unless told not to:
            # in a log file, a journal or a pipe they are noise. An operator's own setting wins.
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        try:
            ray.init(
                address=target,
                namespace=NAMESPACE,
                log_to_driver=True,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise StagevisorError(
                ErrorCode.CLUSTER_UNREACHABLE,
                f"cannot join the Ray cluster at {target} (--ray-address): "
                f"{first_line(error)}; start it (`ray start --head`) or give its address",
            ) from None
    return ray


def cluster_nodes(ray: Any) -> list[ClusterNode]:
    return alive_nodes(ray.nodes())


def check_plan_on_cluster(plan: Plan, address: str | None) -> None:
    """Join the cluster (from the main thread, before the daemon's loop: `serve` stays joined) and raise
    CLUSTER_LACKS when it lacks what the plan needs (then leave it)."""
    ray = connect(address)
    try:
        check_cluster(plan, cluster_nodes(ray), address or "")
    except BaseException:
        ray.shutdown()
        raise


def first_line(error: BaseException) -> str:
    """The first line of a Ray error's message (its type's name when it has none): Ray's own go on for pages."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
