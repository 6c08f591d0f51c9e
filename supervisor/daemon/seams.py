"""What the daemon runs on: the data plane's gateway as the daemon's modules see it, and the factories the
composition (supervisor/service.py) passes for its gateway and launcher."""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, TypeVar

from stagevisor.supervisor.daemon.handle import DaemonLauncher
from stagevisor.supervisor.daemon.health import HealthGateway
from stagevisor.supervisor.daemon.live_change import SwitchGateway
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.daemon.replicas import ReplicaGateway
from stagevisor.supervisor.daemon.shutdown import ShutdownGateway
from stagevisor.supervisor.daemon.views import ReportGateway
from stagevisor.supervisor.plan import Plan
from stagevisor.supervisor.worker.spec import WorkerSpec


class DaemonGateway(ReplicaGateway, SwitchGateway, ReportGateway, ShutdownGateway, HealthGateway, Protocol):
    """What the daemon needs from the data plane's gateway (supervisor/dataplane/gateway.py): what its replicas,
    a live change, its reports, its shutdown and its health each ask of it; its workers map large payloads in its
    shared-memory directory (`shm_dir`, in their spec)."""


GatewayT = TypeVar("GatewayT", bound=DaemonGateway)
"""The gateway a Daemon runs: the data plane's Gateway in service.py, a fake in tests."""
GatewayFactory = Callable[..., GatewayT]
"""(plan, stage -> worker address, sink address, *, admission) -> a gateway."""
LauncherFactory = Callable[[Plan, Mapping[str, WorkerSpec], GatewayT, DaemonOptions], DaemonLauncher]
"""(plan, worker specs, the daemon's gateway, options) -> the launcher of its workers; service.py picks it."""
