"""The daemon's gRPC servers: binding one (create_server, bind_server), claiming its unix socket, its health.

service.py binds the admin and the public endpoints with these; a port in use or a live daemon at the
address is a DaemonError that names the option and what to do.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from stagevisor.supervisor.addresses import bind_failure, unix_path
from stagevisor.supervisor.daemon.runtime_files import SocketClaim
from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from stagevisor.supervisor.security.server import Security

log = logging.getLogger("stagevisor.admin")

SYNTHESIS_SERVICE = "stagevisor.v1.Synthesis"
HEALTH_SERVICES = ("", SYNTHESIS_SERVICE)
LIVE_CHECK_TIMEOUT = 1.0

SERVER_OPTIONS = (("grpc.so_reuseport", 0),)
"""gRPC sets SO_REUSEPORT by default: a second daemon on the same port would start silently and take a
share of the traffic. Off, binding a port in use fails, and the daemon says so."""


def create_server(
    address: str, security: Security | None = None, options: tuple[tuple[str, Any], ...] = ()
) -> tuple[grpc.aio.Server, int]:
    """An aio server bound to `address` (host:port or unix:PATH); the port is 0 for unix sockets.

    A unix socket's directory is created private (0700) when missing. An
    address that cannot be bound (a port in use) raises OSError saying why. With
    `security`, the server serves TLS and checks the bearer token it carries.
    """
    security = security or Security()
    path = unix_path(address)
    if path is not None and not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    server = grpc.aio.server(options=SERVER_OPTIONS + tuple(options), interceptors=security.grpc_interceptors())
    credentials = security.grpc_server_credentials()
    try:
        port = (
            server.add_insecure_port(address) if credentials is None else server.add_secure_port(address, credentials)
        )
    except RuntimeError:  # grpc raises RuntimeError("Failed to bind ...") when it cannot bind
        port = None
    if port is None or (port == 0 and path is None):
        raise OSError(
            bind_problem(address)
            if path is None
            else f"cannot bind a unix socket at {path}: its directory must exist and be writable by this user, "
            "and the path free"
        )
    return server, port


def bind_problem(address: str) -> str:
    """Why `address` (host:port) cannot be bound, in words, found by binding it with a plain socket."""
    import socket

    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError):
        return f"{address} is not a valid host:port address"
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind(sockaddr)
            except OSError as error:
                return bind_failure(address, error)
    return f"cannot bind {address}"


class HealthReporter:
    """One grpc.health.v1 servicer per server; SERVING only while every group is READY."""

    def __init__(self) -> None:
        self.servicers: list[health_aio.HealthServicer] = []

    def add_to_server(self, server: grpc.aio.Server) -> None:
        servicer = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        self.servicers.append(servicer)

    async def set(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for servicer in self.servicers:
            for service in HEALTH_SERVICES:
                await servicer.set(service, status)


def release_all(claims: list[SocketClaim]) -> None:
    for claim in claims:
        try:
            claim.release()
        except OSError as error:
            log.warning("could not release %s: %s", claim.path, error)


async def claim_socket(address: str, option: str, *, remove_stale: bool = True) -> SocketClaim | None:
    """Lock a unix socket path for this daemon and clear a stale socket there; None for TCP addresses.

    Raises DaemonError: DAEMON_RUNNING when a live daemon holds or answers at
    the path, UNSAFE_PATH when something other than a socket is there, DAEMON_ERROR when its lock file or
    directory cannot be written (a full file system).
    """
    path = unix_path(address)
    if path is None:
        return None
    claim = SocketClaim.acquire(path, option)
    try:
        claim.refuse_non_socket()
        # A daemon of a version without the lock file: its socket still answers.
        if claim.existing() == "socket" and await daemon_answers(address):
            raise DaemonError(
                f"a stagevisor daemon already answers at {address} ({option}); "
                f"stop it with `stagevisor stop` or choose another {option}",
                code=DaemonErrorCode.DAEMON_RUNNING,
            )
        if remove_stale:
            claim.remove_stale_socket()
    except BaseException:
        claim.release()
        raise
    return claim


def bind_server(
    address: str,
    option: str,
    claim: SocketClaim | None,
    security: Security | None = None,
    options: tuple[tuple[str, Any], ...] = (),
) -> tuple[grpc.aio.Server, int]:
    """create_server() for `option`; a unix socket binds at the claim's staging path and is moved into place.

    Returns (server, port; 0 for a unix socket). Raises DaemonError naming the
    address: ADDRESS_IN_USE for a port in use.
    """
    try:
        server, port = create_server(address if claim is None else f"unix:{claim.staging_path}", security, options)
    except OSError as error:
        code = DaemonErrorCode.ADDRESS_IN_USE if "in use" in str(error) else DaemonErrorCode.DAEMON_ERROR
        raise DaemonError(
            f"cannot listen on {address} ({option}): {error}; choose another {option}", code=code
        ) from None
    if claim is not None:
        claim.bound()  # grpc binds in add_insecure_port: the socket exists, move it into place
    return server, port


async def daemon_answers(address: str, timeout: float = LIVE_CHECK_TIMEOUT) -> bool:
    """True when a gRPC health service answers at `address` within `timeout` seconds."""
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout, wait_for_ready=False
            )
            return True
        except grpc.aio.AioRpcError:
            return False


async def ensure_no_live_daemon(admin_address: str) -> None:
    """Refuse to start over a live daemon or over a file that is not a socket; removes nothing.

    A unix admin socket is checked under its lock (a daemon holding the lock is
    live, however slowly it answers); a TCP address by asking it. The socket a
    dead daemon left is removed when the servers start, under the lock.
    """
    if unix_path(admin_address) is None:
        if await daemon_answers(admin_address):
            raise DaemonError(
                f"a stagevisor daemon already answers at {admin_address}; "
                "stop it with `stagevisor stop` or choose another --admin-address",
                code=DaemonErrorCode.DAEMON_RUNNING,
            )
        return
    claim = await claim_socket(admin_address, "--admin-address", remove_stale=False)
    if claim is not None:
        claim.release()
