"""DaemonOptions: the runtime knobs of `stagevisor serve` a Daemon runs with (placement options live in the Plan).

The HTTP API's own settings (how it names speech, its connection limits) are not the daemon's: service.run takes
them beside these, so the daemon package never imports the HTTP front end.

The daemon's other modules read them from here, not from core.py, so each imports only what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from stagevisor.supervisor.addresses import DEFAULT_LISTEN, default_admin_address
from stagevisor.supervisor.dataplane.admission import AdmissionLimits
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.security.server import Security


@dataclass
class DaemonOptions:
    """Runtime knobs of `stagevisor serve` (placement options live in the Plan)."""

    admin_address: str = field(default_factory=default_admin_address)
    listen: str = DEFAULT_LISTEN
    log_level: str = "INFO"
    drain_timeout: float = 30.0
    stop_timeout: float = 10.0
    start_timeout: float = 600.0
    max_restarts: int | None = None
    """Consecutive crashes after which a group is FAILED; None: retried for as long as it crashes."""
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    """The restart backoff's cap: a crash-looping group is retried this often."""
    heartbeat_timeout: float = 10.0
    """A READY worker whose event loop is silent this long is killed and restarted; 0: off."""
    worker_start: str = "forkserver"
    """forkserver (workers fork from a preloaded fork server: fast restarts) or spawn."""
    launcher: str = "local"
    """local (worker processes on this host) or ray (each worker under a Ray actor: supervisor/cluster/launcher.py)."""
    ray_address: str | None = None
    """The Ray cluster of `--launcher ray` (None: RAY_ADDRESS, else the local one)."""
    standby_workers: tuple[str, ...] = ()
    """CPU groups that keep a built standby worker for their restarts (--standby-worker; launcher.Launcher)."""
    run_dir: Path | None = None
    """Where worker sockets go; default: a per-daemon subdirectory of runtime_dir()."""
    metrics: bool = True
    """Collect Prometheus metrics and per-request timings (workers measure their stages)."""
    metrics_address: str | None = None
    """HOST:PORT of a standalone /metrics endpoint; None: none (the HTTP API serves /metrics)."""
    rss_budgets: dict[str, int] = field(default_factory=dict)
    """Group -> resident-memory budget in bytes (--rss-budget); over it raises a warning."""
    resource_interval: float = 1.0
    """Seconds between measurements of the workers' resources."""
    import_paths: tuple[str, ...] = ()
    """Directories workers put first on sys.path to find stage factories (supervisor/worker/app_paths.py)."""
    record_handoffs: str = ""
    """`stagevisor check --verify-edges` only: where workers record what their stages receive (WorkerSpec)."""
    http: str | None = None
    """HOST:PORT of the HTTP API (`serve --http`, default 127.0.0.1:8000 there); None: no HTTP server."""
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    """How many synthesis requests run and wait at once, over gRPC and HTTP together."""
    public_security: Security = field(default_factory=Security)
    """TLS and bearer token of the public endpoint (--tls-cert, --tls-key, --tls-client-ca, --api-key-file)."""
    admin_security: Security = field(default_factory=Security)
    """TLS and token of the admin API (the same certificate, --admin-api-key-file)."""
    admin_allowed_uids: tuple[int, ...] = ()
    """Users besides the daemon's own and root whose connections a unix admin address lets in (--admin-allow-uid)."""
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    """Per-request caps of the public endpoints (--max-audio-seconds, --request-timeout, --stream-idle-timeout)."""
    voice_names: Mapping[str, str] = field(default_factory=dict)
    """The config's `voices` at start: a name clients send -> the model's voice it stands for (an apply of a config
    replaces the daemon's map: `Daemon.voice_names`)."""
