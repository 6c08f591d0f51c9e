"""Worker specs and addresses: what each worker of a Plan starts with, where it and the gateway listen, and the
default launcher built from those specs.

Functions of a Plan and a run directory (the daemon's, or an apply's run_dir/g<n>): nothing here starts a
process or opens a socket; the daemon, an apply and a restart beside a worker all make their specs here.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from stagevisor.supervisor.daemon.launcher import Launcher
from stagevisor.supervisor.daemon.start_policy import forks_from_server, preload_modules, standby_groups
from stagevisor.supervisor.daemon.options import DaemonOptions
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.plan import Plan, Worker
from stagevisor.supervisor.worker.spec import WorkerSpec, device_environment, group_gpus

MAX_UNIX_PATH = 100
"""A unix socket's path must be shorter than this (sun_path is 108 bytes on Linux; the rest is margin)."""


def local_launcher(plan: Plan, specs: Mapping[str, WorkerSpec], gateway: object, options: DaemonOptions) -> Launcher:
    """The default launcher: worker processes on this host, forked from a preloaded fork server or spawned (the
    gateway, which other launchers get, is not needed here)."""
    return Launcher(
        options.worker_start,
        preload=preload_modules(specs.values(), plan.preload),
        heartbeat_timeout=options.heartbeat_timeout,
        standby=standby_groups(specs, options.standby_workers),
        forks=any(map(forks_from_server, specs.values())),
    )


def worker_address(run_dir: Path, group_index: int, worker: Worker, *, alternate: bool = False) -> str:
    """`g<index>.sock` for a group's single worker and its replica 0 (so scaling keeps it), `g<index>.<i>.sock`.

    `alternate`: `g<index>.alt.sock` for that first worker instead, where a restart without a pause starts
    the new worker beside the old one; each such restart moves it between the two.
    """
    suffix = f".{worker.replica}" if worker.replica else ".alt" if alternate else ""
    return f"unix:{run_dir / f'g{group_index}{suffix}.sock'}"


def gateway_addresses(plan: Plan, run_dir: Path) -> tuple[dict[str, str], str]:
    """What the gateway of `plan` in `run_dir` dials and listens on: stage -> its group's address (the group's
    first `worker_address`), and the gateway's own sink address. Every WorkerSpec carries the same two."""
    address = {g.name: worker_address(run_dir, index, g.workers()[0]) for index, g in enumerate(plan.groups)}
    routes = {stage.name: address[plan.group_of(stage.name).name] for stage in plan.stages}
    return routes, f"unix:{run_dir / 'gateway.sock'}"


def stop_window(stop_timeout: float, drain_grace: float) -> float:
    """How long the daemon waits for a worker to exit after SIGTERM before SIGKILL: what it may drain (a replica's
    `drain_grace`), then the daemon's --stop-timeout (`stop_timeout`). Pure."""
    return drain_grace + stop_timeout


def worker_specs(
    plan: Plan,
    run_dir: Path,
    *,
    parent_pid: int,
    log_level: str,
    import_paths: tuple[str, ...] = (),
    environ: Mapping[str, str] = os.environ,
    metrics: bool = False,
    drain_timeout: float = 0.0,
    stop_timeout: float | None = None,
    alternate: frozenset[str] = frozenset(),
    record_handoffs: str = "",
    shm_dir: str = "",
) -> tuple[dict[str, WorkerSpec], str]:
    """One WorkerSpec per worker (in plan order: one per group, one per replica) and the daemon's sink address.

    `environ` is the daemon's. A group's address in `routes` is its first
    worker's `worker_address`; the first worker of a group in `alternate` runs
    at its alternate address instead, which `replica_routes` maps the group's
    address to, as it lists every replica's for replicated groups.
    A replica drains what it holds for up to `drain_timeout` when stopped; each worker is told how long the
    daemon waits for it to exit after SIGTERM (`stop_window` of the daemon's `stop_timeout`). Every
    worker records its handoffs in `record_handoffs` when it is set (the check's), and maps large payloads
    in `shm_dir`, the gateway's shared-memory directory.
    """
    index_of = {group.name: index for index, group in enumerate(plan.groups)}
    workers = plan.workers()
    routes, sink = gateway_addresses(plan, run_dir)
    addresses = {
        w.name: worker_address(run_dir, index_of[w.group], w, alternate=w.group in alternate and not w.replica)
        for w in workers
    }
    # The alternate addresses too: a restart must not find its new worker's path too long.
    spares = (worker_address(run_dir, index_of[g.name], g.workers()[0], alternate=True) for g in plan.groups)
    longest = max([sink, *addresses.values(), *spares], key=len)
    if len(longest) - len("unix:") >= MAX_UNIX_PATH:
        raise DaemonError(
            f"socket path {longest[5:]!r} is too long for a unix socket; "
            "set STAGEVISOR_RUNTIME_DIR to a shorter directory"
        )
    replica_routes = {
        routes[g.stages[0]]: tuple(addresses[w.name] for w in g.workers())
        for g in plan.groups
        if g.replicas > 1 or g.name in alternate
    }
    address_gpus = {addresses[w.name]: w.gpu for w in workers}
    specs = {}
    for worker in workers:
        group = plan.group(worker.group)
        if worker.replica is not None:  # its own GPU: each replica sees only its device
            group = replace(group, gpu=worker.gpu)
        drain_grace = drain_timeout if worker.replica is not None else 0.0
        specs[worker.name] = WorkerSpec(
            group=group,
            stages=tuple(stage for stage in plan.stages if stage.name in group.stages),
            model_path=plan.model_path,
            address=addresses[worker.name],
            routes=routes,
            sink_address=sink,
            parent_pid=parent_pid,
            log_level=log_level,
            metrics=metrics,
            import_paths=import_paths,
            env=device_environment(group_gpus(group, plan.stages), environ),
            address_gpus=address_gpus,
            cache_dir="",  # each worker's node cache (worker.main.node_cache_dir), kept across daemons
            worker=worker.name if worker.replica is not None else "",
            replica_routes=replica_routes,
            drain_grace=drain_grace,
            stop_timeout=None if stop_timeout is None else stop_window(stop_timeout, drain_grace),
            record_handoffs=record_handoffs,
            shm_dir=shm_dir,
        )
    return specs, sink
