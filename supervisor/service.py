"""Composition: wire a Daemon to its admin and public gRPC servers, signals and logging, and run it.

The one module that imports the daemon, the admin API and the data plane's
public services together; none of them imports this one. `stagevisor serve`
calls `run()`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from stagevisor.supervisor import admin
from stagevisor.supervisor._proto import admin_pb2_grpc
from stagevisor.supervisor.addresses import runtime_dir
from stagevisor.supervisor.daemon import (
    Daemon,
    DaemonOptions,
    StartupError,
    format_startup_failure,
    make_private_dir,
    remove_stale_run_dirs,
)
from stagevisor.supervisor.dataplane.synthesis import PipelineEntry, add_synthesis_to_server
from stagevisor.supervisor.errors import DaemonError
from stagevisor.supervisor.plan import Plan

log = logging.getLogger("stagevisor.daemon")


@dataclass
class Servers:
    """The admin and public servers of one daemon."""

    admin: grpc.aio.Server
    public: grpc.aio.Server
    admin_address: str
    listen: str
    health: admin.HealthReporter

    async def stop(self, grace: float = 1.0) -> None:
        await asyncio.gather(self.admin.stop(grace), self.public.stop(grace))
        for address in (self.admin_address, self.listen):
            path = admin.unix_path(address)
            if path is not None:
                path.unlink(missing_ok=True)


async def start_servers(daemon: Daemon, *, admin_address: str, listen: str) -> Servers:
    """Admin (Admin + health + reflection) and public (Synthesis + health + reflection) servers, started."""
    for name, address in (("--admin-address", admin_address), ("--listen", listen)):
        if not admin.is_loopback(address):
            log.warning("%s %s is reachable from other hosts; the admin API has no authentication", name, address)
    servers = []
    for option, address in (("--admin-address", admin_address), ("--listen", listen)):
        try:
            servers.append(admin.create_server(address)[0])
        except (RuntimeError, OSError) as error:  # grpc raises RuntimeError when it cannot bind
            raise DaemonError(f"cannot listen on {address} ({option}): address in use or not available; "
                              f"choose another {option}") from error
    admin_server, public_server = servers
    health = admin.HealthReporter()
    admin_pb2_grpc.add_AdminServicer_to_server(admin.AdminServicer(daemon), admin_server)
    gateway: PipelineEntry = daemon.gateway  # type: ignore[assignment]  # the Gateway is both
    add_synthesis_to_server(gateway, public_server)
    for server, services in ((admin_server, (admin.ADMIN_SERVICE,)), (public_server, (admin.SYNTHESIS_SERVICE,))):
        health.add_to_server(server)
        reflection.enable_server_reflection(
            (*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    await health.set(False)
    daemon.serving_listeners.append(lambda serving: asyncio.ensure_future(health.set(serving)))
    await admin_server.start()
    await public_server.start()
    path = admin.unix_path(admin_address)
    if path is not None:
        path.chmod(0o600)
    return Servers(admin_server, public_server, admin_address, listen, health)


async def run(plan: Plan, options: DaemonOptions) -> int:
    """Serve a Plan until SIGTERM/SIGINT or an admin Shutdown; return the exit status."""
    run_parent = options.run_dir.parent if options.run_dir else runtime_dir()
    make_private_dir(run_parent)
    await admin.ensure_no_live_daemon(options.admin_address)
    if options.run_dir is None:  # only our own runtime directory holds d<pid> directories
        for stale in remove_stale_run_dirs(run_parent):
            log.info("removed %s, left by a daemon that is gone", stale)
    daemon = Daemon(plan, options)
    servers = await start_servers(daemon, admin_address=options.admin_address, listen=options.listen)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, daemon.requests.put_nowait, ("signal", signum))
    log.info("admin API on %s, public endpoint on %s", options.admin_address, options.listen)
    try:
        start = asyncio.create_task(daemon.start())
        request = asyncio.create_task(daemon.requests.get())
        await asyncio.wait({start, request}, return_when=asyncio.FIRST_COMPLETED)
        if start.done() and start.exception() is not None:
            request.cancel()
            error = start.exception()
            if isinstance(error, StartupError):
                print(format_startup_failure(error), file=sys.stderr, flush=True)
                return 1
            raise error
        if not request.done():
            kind, value = await request
        else:
            kind, value = request.result()
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
        grace = value if kind == "shutdown" else None
        log.info("shutting down (%s)", f"signal {signal.Signals(value).name}" if kind == "signal" else "admin request")
        await daemon.shutdown(grace)
        return 0
    finally:
        await daemon.shutdown(0.0)
        await servers.stop()


def configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s [daemon pid %(process)d] %(name)s: %(message)s")
