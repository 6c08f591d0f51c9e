"""How the CLI dials a daemon: TLS and the bearer token it sends, its options, and the checks of an admin socket.

grpc is imported inside the functions that need it, so `stagevisor plan`
(which builds every command's parser) never loads it.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from stagevisor.supervisor import envs
from stagevisor.supervisor.addresses import unix_path
from stagevisor.supervisor.errors import ErrorCode
from stagevisor.supervisor.security.files import (
    SecurityError,
    check_key_pair,
    load_api_key,
    parse_api_key,
    read_secret,
    refuse_unless_ca,
)

ENV_API_KEY = envs.API_KEY.name
"""The bearer token the CLI sends (the value itself), when --api-key-file is not given."""
ENV_TLS_CA = envs.TLS_CA.name
"""A CA bundle (path) the CLI verifies the daemon's certificate with; setting it turns TLS on."""
ENV_TLS_CLIENT_CERT = envs.TLS_CLIENT_CERT.name
ENV_TLS_CLIENT_KEY = envs.TLS_CLIENT_KEY.name


@dataclass(frozen=True)
class ClientSecurity:
    """How the CLI dials a daemon: TLS (with an optional CA and client certificate) and a bearer token."""

    api_key: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_pem: bytes | None = field(default=None, repr=False)
    cert_pem: bytes | None = field(default=None, repr=False)
    key_pem: bytes | None = field(default=None, repr=False)
    tls_from: tuple[str, ...] = ()
    """What turned TLS on (`--tls`, `--tls-ca`, `$STAGEVISOR_TLS_CA`, ...): what to drop for a plaintext daemon."""

    def channel(self, address: str) -> Any:
        """A synchronous grpc channel to `address` that uses TLS and sends the token as configured."""
        import grpc

        credentials = self._credentials()
        if credentials is not None:
            channel = grpc.secure_channel(address, credentials)
        else:
            channel = grpc.insecure_channel(address)
        if self.api_key is not None:
            channel = grpc.intercept_channel(channel, _token_interceptor_class()(self.api_key))
        return channel

    def aio_channel(self, address: str) -> Any:
        """The same as `channel`, for asyncio (`grpc.aio`): TLS as configured, the token sent with every call."""
        import grpc

        credentials = self._credentials()
        interceptors = aio_token_interceptors(self.api_key) if self.api_key is not None else None
        if credentials is not None:
            return grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
        return grpc.aio.insecure_channel(address, interceptors=interceptors)

    def _credentials(self) -> Any:
        """`grpc.ssl_channel_credentials` for a TLS dial, or None for plaintext."""
        if not self.tls:
            return None
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )


def add_client_options(parser: Any) -> None:
    """The CLI's `--api-key-file`, `--tls`, `--tls-ca`, `--tls-client-cert`, `--tls-client-key` options."""
    group = parser.add_argument_group("TLS and authentication (flags win over the environment)")
    group.add_argument(
        "--api-key-file",
        metavar="FILE",
        help=f"file holding the bearer token to send (default: ${ENV_API_KEY}, the token itself)",
    )
    group.add_argument(
        "--tls",
        action="store_true",
        help="dial with TLS, verifying the daemon against the system CAs (implied by --tls-ca)",
    )
    group.add_argument(
        "--tls-ca",
        metavar="FILE",
        help=f"PEM CA bundle that signed the daemon's certificate; turns TLS on (default: ${ENV_TLS_CA})",
    )
    group.add_argument(
        "--tls-client-cert", metavar="FILE", help=f"client certificate for mutual TLS (default: ${ENV_TLS_CLIENT_CERT})"
    )
    group.add_argument(
        "--tls-client-key", metavar="FILE", help=f"private key of --tls-client-cert (default: ${ENV_TLS_CLIENT_KEY})"
    )


def client_security(args: Any, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """ClientSecurity from the options of `add_client_options`, falling back to the environment."""
    env = os.environ if environ is None else environ
    api_key = None
    if args.api_key_file:
        api_key = load_api_key(args.api_key_file)
    elif envs.API_KEY.get(env):
        api_key = parse_api_key(envs.API_KEY.get(env), f"${ENV_API_KEY}")
    ca_path = args.tls_ca or envs.TLS_CA.get(env) or None
    cert_path = args.tls_client_cert or envs.TLS_CLIENT_CERT.get(env) or None
    key_path = args.tls_client_key or envs.TLS_CLIENT_KEY.get(env) or None
    if (cert_path is None) != (key_path is None):
        raise SecurityError(
            ErrorCode.INVALID_CONFIG, "--tls-client-cert and --tls-client-key go together: give both for mutual TLS"
        )
    ca_from = "--tls-ca" if args.tls_ca else f"${ENV_TLS_CA}"
    cert_from = (
        "--tls-client-cert/--tls-client-key"
        if args.tls_client_cert
        else f"${ENV_TLS_CLIENT_CERT}/${ENV_TLS_CLIENT_KEY}"
    )
    tls_from = tuple(
        source for source, given in (("--tls", args.tls), (ca_from, ca_path), (cert_from, cert_path)) if given
    )
    cert_pem = key_pem = None
    if cert_path is not None and key_path is not None:
        cert_pem = read_secret(Path(cert_path), "client certificate", "--tls-client-cert")
        key_pem = read_secret(Path(key_path), "client private key", "--tls-client-key")
        cert_flag, key_flag = cert_from.split("/")
        check_key_pair(
            Path(cert_path), Path(key_path), f"{_named(cert_flag, cert_path)} and {_named(key_flag, key_path)}"
        )
    return ClientSecurity(
        api_key=api_key,
        tls=bool(tls_from),
        ca_pem=_read_ca(Path(ca_path), ca_from) if ca_path else None,
        cert_pem=cert_pem,
        key_pem=key_pem,
        tls_from=tls_from,
    )


def _named(source: str, path: object) -> str:
    """A file as the operator gave it: `--flag PATH`, or `$VARIABLE=PATH` from the environment."""
    return f"{source} {path}" if source.startswith("--") else f"{source}={path}"


def _read_ca(path: Path, source: str) -> bytes:
    """The CA bundle the CLI verifies the daemon with, refused unless it holds a PEM certificate.

    Checked here, before anything is dialled: gRPC takes any bytes, logs its own lines about them and then
    fails every handshake, which looks like a daemon that does not answer.
    """
    pem = read_secret(path, "CA bundle", source)
    refuse_unless_ca(
        pem,
        _named(source, path),
        ": give the PEM file (-----BEGIN CERTIFICATE-----) of the CA that signed the daemon's --tls-cert, "
        "or --tls to verify the daemon against the system CAs",
    )
    return pem


def trusted_uids() -> frozenset[int]:
    """Whose admin sockets the CLI dials: its own user's and root's."""
    return frozenset({os.getuid(), 0})


def check_admin_socket(address: str) -> None:
    """Refuse to dial a unix admin address another user may control, before any byte (or token) is sent.

    The daemon's runtime-directory rules, from the client's side: the socket's
    directory is not a symbolic link, belongs to this user or root, and no one
    else may write to it unless it is sticky (like /tmp); the socket is a socket
    (not a link) of this user or root. Then, for paths and abstract names alike,
    the process listening there must run as this user or root (SO_PEERCRED of a
    probe connection). TCP addresses pass (TLS and the token protect them).
    SecurityError INSECURE_ENDPOINT names what is wrong. A socket that does not
    exist passes: dialing it finds no daemon.
    """
    import socket
    import struct

    trusted = trusted_uids()
    path = unix_path(address)
    if address.startswith("unix-abstract:"):
        target: str = "\0" + address[len("unix-abstract:") :]
    elif path is not None:
        _check_socket_path(path, trusted)
        target = str(path)
    else:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2.0)
        try:
            probe.connect(target)
        except OSError:
            return  # nothing listens: the caller reports no daemon
        _, uid, _ = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    finally:
        probe.close()
    if uid not in trusted:
        raise SecurityError(
            ErrorCode.INSECURE_ENDPOINT,
            f"not dialing {address}: the process listening there runs as uid {uid}, not as you (uid {os.getuid()}) "
            "or root; another user may have planted it. Check --admin-address",
        )


def _check_socket_path(path: Path, trusted: frozenset[int]) -> None:
    def refuse(why: str) -> SecurityError:
        return SecurityError(
            ErrorCode.INSECURE_ENDPOINT,
            f"not dialing unix:{path}: {why}; another user may have planted it. Remove it, or point "
            "STAGEVISOR_RUNTIME_DIR (or --admin-address) at a directory you own",
        )

    try:
        directory = os.lstat(path.parent)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(directory.st_mode):
        raise refuse(f"its directory {path.parent} is a symbolic link")
    if not stat.S_ISDIR(directory.st_mode):
        raise refuse(f"{path.parent} is not a directory")
    if directory.st_uid not in trusted:
        raise refuse(f"its directory {path.parent} belongs to uid {directory.st_uid}, not to you (uid {os.getuid()})")
    if directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not directory.st_mode & stat.S_ISVTX:
        raise refuse(
            f"its directory {path.parent} is writable by other users (mode {stat.S_IMODE(directory.st_mode):04o})"
        )
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise refuse("it is a symbolic link")
    if not stat.S_ISSOCK(info.st_mode):
        raise refuse("it is not a socket")
    if info.st_uid not in trusted:
        raise refuse(f"the socket belongs to uid {info.st_uid}, not to you (uid {os.getuid()})")


@functools.cache
def _token_interceptor_class() -> type:
    import collections

    import grpc

    class _CallDetails(
        collections.namedtuple(
            "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
        ),
        grpc.ClientCallDetails,
    ):
        pass

    class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        """Adds `authorization: Bearer <token>` to every call of a synchronous channel."""

        def __init__(self, token: str) -> None:
            self._header = ("authorization", f"Bearer {token}")

        def _details(self, details: Any) -> Any:
            metadata = [*(details.metadata or ()), self._header]
            return _CallDetails(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                getattr(details, "wait_for_ready", None),
                getattr(details, "compression", None),
            )

        def intercept_unary_unary(self, continuation, client_call_details, request):
            return continuation(self._details(client_call_details), request)

        def intercept_unary_stream(self, continuation, client_call_details, request):
            return continuation(self._details(client_call_details), request)

    return TokenInterceptor


def aio_token_interceptors(token: str) -> list[Any]:
    """Client interceptors adding `authorization: Bearer <token>` to the unary and server-streaming calls of a
    grpc.aio channel: one object per kind, since grpc.aio files each interceptor under the first kind it is."""
    import grpc

    header = ("authorization", f"Bearer {token}")

    def with_token(details: Any) -> Any:
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*(details.metadata or ()), header),
            details.credentials,
            details.wait_for_ready,
        )

    class UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, client_call_details, request):
            return await continuation(with_token(client_call_details), request)

    class StreamToken(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, client_call_details, request):
            return await continuation(with_token(client_call_details), request)

    return [UnaryToken(), StreamToken()]
