"""TLS and bearer-token settings of the daemon's endpoints: loading, checks, gRPC credentials and interceptors.

One `Security` value describes one endpoint (the public gRPC/HTTP endpoints
share one; the admin API has its own token). The HTTP app uses the same
value: `check_bearer` for the Authorization header and `uvicorn_ssl_options`
for its TLS. grpc is imported inside the functions that need it, so
`stagevisor plan` (which builds every command's parser) never loads it.
"""

from __future__ import annotations

import functools
import hmac
import os
import re
import ssl
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from stagevisor.supervisor import envs
from stagevisor.supervisor.addresses import unix_path
from stagevisor.supervisor.errors import ErrorCode, StagevisorError

ENV_API_KEY = envs.API_KEY.name
"""The bearer token the CLI sends (the value itself), when --api-key-file is not given."""
ENV_TLS_CA = envs.TLS_CA.name
"""A CA bundle (path) the CLI verifies the daemon's certificate with; setting it turns TLS on."""
ENV_TLS_CLIENT_CERT = envs.TLS_CLIENT_CERT.name
ENV_TLS_CLIENT_KEY = envs.TLS_CLIENT_KEY.name

MIN_API_KEY_CHARS = 16
MAX_API_KEY_CHARS = 4096
UNAUTHENTICATED_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Health stays open (load balancer and kubernetes probes send no token); it reveals only SERVING or not."""
GENERATE_HINT = "generate one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE"


class SecurityError(StagevisorError):
    """A TLS or API-key setting is unusable, or an endpoint would be exposed without protection.

    Not recoverable by retrying: the operator fixes the files or flags the message names.
    """


@dataclass(frozen=True)
class Security:
    """TLS material and the bearer token of one endpoint; all empty means plaintext without authentication.

    `client_ca_pem` set means mutual TLS: clients must present a certificate
    signed by that CA. `api_key` set means every call (except gRPC health)
    must carry `authorization: Bearer <api_key>`.
    """

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)
    client_ca_pem: bytes = field(default=b"", repr=False)
    api_key: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.cert_pem)

    @property
    def mutual_tls(self) -> bool:
        return bool(self.client_ca_pem)

    @property
    def authenticated(self) -> bool:
        return self.api_key is not None

    def describe(self) -> str:
        """`mutual TLS, bearer token` and the like, for log lines."""
        parts = ["mutual TLS" if self.mutual_tls else "TLS" if self.tls else "plaintext"]
        parts.append("bearer token" if self.authenticated else "no authentication")
        return ", ".join(parts)

    def check_bearer(self, header: str | None) -> bool:
        """True when `header` (an Authorization value) carries this endpoint's token, or none is required."""
        if self.api_key is None:
            return True
        return check_bearer(header, self.api_key)

    def with_api_key(self, api_key: str | None) -> "Security":
        """The same TLS material with another token (the admin API's)."""
        return Security(
            self.cert_file, self.key_file, self.client_ca_file, self.cert_pem, self.key_pem, self.client_ca_pem, api_key
        )

    # -- gRPC ----------------------------------------------------------------

    def grpc_server_credentials(self) -> Any:
        """`grpc.ssl_server_credentials` for this endpoint, or None for plaintext."""
        if not self.tls:
            return None
        import grpc

        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem or None,
            require_client_auth=self.mutual_tls,
        )

    def grpc_interceptors(self) -> list[Any]:
        """Server interceptors enforcing the bearer token (empty when no token is required)."""
        return [bearer_interceptor(self)] if self.authenticated else []

    # -- HTTP (uvicorn) ------------------------------------------------------

    def uvicorn_ssl_options(self) -> dict[str, Any]:
        """Keyword arguments for `uvicorn.Config` that serve this endpoint's TLS (empty for plaintext)."""
        if not self.tls:
            return {}
        options: dict[str, Any] = {"ssl_certfile": str(self.cert_file), "ssl_keyfile": str(self.key_file)}
        if self.mutual_tls:
            options.update(ssl_ca_certs=str(self.client_ca_file), ssl_cert_reqs=ssl.CERT_REQUIRED)
        return options


def check_bearer(header: str | None, api_key: str) -> bool:
    """True when `header` is `Bearer <api_key>` (scheme case-insensitive); constant-time in the token."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(
        token.strip().encode("utf-8", "surrogateescape"), api_key.encode("utf-8", "surrogateescape")
    )


def sole_authorization(values: list[str]) -> tuple[str | None, str]:
    """(the one Authorization value, why a refusal would be); None when there is none or more than one.

    Two values are refused rather than one picked: HTTP would take the first and gRPC metadata the last, and a
    proxy in front may check the other one.
    """
    if len(values) > 1:
        return None, f"{len(values)} authorization headers"
    if not values or not values[0]:
        return None, "no bearer token"
    return values[0], "a wrong bearer token"


# -- loading -------------------------------------------------------------------


def _read(path: Path, what: str, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG, f"cannot read the {what} {path} ({flag}): {error.strerror or error}"
        ) from None


def load_api_key(path: str | os.PathLike[str] | None, flag: str = "--api-key-file") -> str | None:
    """The token in `path` (surrounding whitespace and a leading byte-order mark stripped), or None when no file
    is given.

    Refuses an empty, short or non-printable token (`parse_api_key`); see
    `key_file_warning` for a file other users may read.
    """
    if path is None:
        return None
    raw = _read(Path(path), "API key file", flag)
    # utf-8-sig: a byte-order mark at the start (as some editors save text) is not part of the key.
    return parse_api_key(raw.decode("utf-8-sig", "replace"), f"{flag} {path}")


def parse_api_key(text: str, source: str) -> str:
    """Validate a token from `source` (a file or an environment variable) and return it stripped."""
    token = text.strip()
    if not token:
        raise SecurityError(ErrorCode.INVALID_CONFIG, f"{source} holds no API key; {GENERATE_HINT}")
    if len(token) > MAX_API_KEY_CHARS or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: the API key must be one line of printable ASCII without spaces "
            f"(at most {MAX_API_KEY_CHARS} characters); {GENERATE_HINT}",
        )
    if len(token) < MIN_API_KEY_CHARS:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{source}: the API key has {len(token)} characters; use at least {MIN_API_KEY_CHARS}; {GENERATE_HINT}",
        )
    return token


def key_file_warning(path: str | os.PathLike[str] | None, flag: str) -> str | None:
    """A warning when a secret file is readable by group or others, else None."""
    if path is None:
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"{flag} {path} is readable by other users (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
    return None


def load_security(
    *,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    tls_client_ca: str | os.PathLike[str] | None = None,
    api_key_file: str | os.PathLike[str] | None = None,
) -> Security:
    """Read and check the files behind `--tls-cert`, `--tls-key`, `--tls-client-ca` and `--api-key-file`.

    The certificate and key must be given together, parse as PEM and match;
    the client CA needs TLS. Every problem is a SecurityError naming the flag
    and file.
    """
    if (tls_cert is None) != (tls_key is None):
        given, missing = ("--tls-cert", "--tls-key") if tls_cert is not None else ("--tls-key", "--tls-cert")
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{given} needs {missing} too: give the certificate chain and its private key as PEM files",
        )
    if tls_client_ca is not None and tls_cert is None:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG, "--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key for the server side"
        )
    cert_pem = key_pem = ca_pem = b""
    cert_file = key_file = ca_file = None
    if tls_cert is not None and tls_key is not None:
        cert_file, key_file = Path(tls_cert), Path(tls_key)
        cert_pem = _read(cert_file, "TLS certificate", "--tls-cert")
        key_pem = _read(key_file, "TLS private key", "--tls-key")
        _check_key_pair(cert_file, key_file, f"--tls-cert {cert_file} and --tls-key {key_file}")
    if tls_client_ca is not None:
        ca_file = Path(tls_client_ca)
        ca_pem = _read(ca_file, "client CA bundle", "--tls-client-ca")
        _refuse_unless_ca(ca_pem, f"--tls-client-ca {ca_file}")
    return Security(cert_file, key_file, ca_file, cert_pem, key_pem, ca_pem, load_api_key(api_key_file))


def check_admin_exposure(address: str, security: Security) -> None:
    """Refuse an admin API without protection: loopback TCP and abstract unix sockets need a token, any other
    host TLS and a token.

    A unix socket path is protected by its private directory and mode 0600; an
    abstract one (`unix-abstract:NAME`) has no file permissions, so besides the
    peer-credential check every admin address gets, it needs a token.
    """
    from stagevisor.supervisor.addresses import is_loopback, is_unix

    if address.startswith("unix-abstract:"):
        if not security.authenticated:
            raise SecurityError(
                ErrorCode.INSECURE_ENDPOINT,
                f"--admin-address {address} is an abstract unix socket, which has no file permissions; "
                "give --admin-api-key-file (a token the CLI sends), or use a unix:PATH address",
            )
        return
    if is_unix(address):
        return
    if is_loopback(address):
        if not security.authenticated:
            raise SecurityError(
                ErrorCode.INSECURE_ENDPOINT,
                f"--admin-address {address} is TCP: every local user could stop the daemon; "
                "give --admin-api-key-file (a token the CLI sends), or use a unix: address",
            )
        return
    missing = [
        what
        for what, ok in (("--tls-cert/--tls-key", security.tls), ("--admin-api-key-file", security.authenticated))
        if not ok
    ]
    if missing:
        raise SecurityError(
            ErrorCode.INSECURE_ENDPOINT,
            f"--admin-address {address} is reachable from other hosts; it needs TLS and a token: "
            f"give {' and '.join(missing)}, or keep the admin API on a unix: address",
        )


# -- gRPC server interceptor --------------------------------------------------------


def _aborting_handler(template: Any, message: str) -> Any:
    """A handler of the same streaming kind as `template` that fails the call with UNAUTHENTICATED."""
    import grpc

    async def deny(request_or_iterator: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kind = (template.request_streaming, template.response_streaming)
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[kind]
    return make(
        deny, request_deserializer=template.request_deserializer, response_serializer=template.response_serializer
    )


@functools.cache
def _bearer_interceptor_class() -> type:
    import grpc

    class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
        """Calls without the endpoint's bearer token end UNAUTHENTICATED; gRPC health stays open for probes."""

        def __init__(self, security: Security) -> None:
            self.security = security

        async def intercept_service(self, continuation, handler_call_details):
            handler = await continuation(handler_call_details)
            if handler is None or handler_call_details.method in UNAUTHENTICATED_METHODS:
                return handler
            values = [
                value.decode("latin-1") if isinstance(value, bytes) else value
                for key, value in handler_call_details.invocation_metadata or ()
                if key == "authorization"
            ]
            header, reason = sole_authorization(values)
            if header is not None and self.security.check_bearer(header):
                return handler
            return _aborting_handler(
                handler,
                f"the call carried {reason}; send `authorization: Bearer <API key>` "
                f"(stagevisor CLI: --api-key-file or ${ENV_API_KEY})",
            )

    return BearerAuthInterceptor


def bearer_interceptor(security: Security) -> Any:
    """A grpc.aio.ServerInterceptor enforcing `security`'s bearer token."""
    return _bearer_interceptor_class()(security)


# -- the CLI's side ---------------------------------------------------------------


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
        cert_pem = _read(Path(cert_path), "client certificate", "--tls-client-cert")
        key_pem = _read(Path(key_path), "client private key", "--tls-client-key")
        cert_flag, key_flag = cert_from.split("/")
        _check_key_pair(
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


def _check_key_pair(cert: Path, key: Path, named: str) -> None:
    """Refuse a certificate and key that are not a PEM chain and its matching unencrypted private key, before
    either is used: gRPC takes any bytes and then fails every handshake, and OpenSSL would ask for an encrypted
    key's passphrase on the terminal (a daemon's or a script's) instead of failing."""

    def encrypted() -> str:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{named}: the private key is encrypted, and gRPC takes only an unencrypted PEM key: give it "
            "decrypted (for example `openssl pkey -in KEY -out KEY.plain`, kept readable by this user only)",
        )

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=encrypted)
    except ssl.SSLError as error:
        raise SecurityError(
            ErrorCode.INVALID_CONFIG,
            f"{named} are not a PEM certificate chain and its matching unencrypted private key "
            f"({error.reason or error})",
        ) from None


def _read_ca(path: Path, source: str) -> bytes:
    """The CA bundle the CLI verifies the daemon with, refused unless it holds a PEM certificate.

    Checked here, before anything is dialled: gRPC takes any bytes, logs its own lines about them and then
    fails every handshake, which looks like a daemon that does not answer.
    """
    pem = _read(path, "CA bundle", source)
    _refuse_unless_ca(
        pem,
        _named(source, path),
        ": give the PEM file (-----BEGIN CERTIFICATE-----) of the CA that signed the daemon's --tls-cert, "
        "or --tls to verify the daemon against the system CAs",
    )
    return pem


def _refuse_unless_ca(pem: bytes, named: str, advice: str = "") -> None:
    """SecurityError naming the file unless `pem` holds a PEM certificate, checked on the bytes already read.

    Text around the certificates is skipped, as OpenSSL and gRPC skip it (bundles carry comments, some in
    UTF-8); a binary file is named as one, since a DER certificate is the likely mistake.
    """
    blocks = _PEM_CERTIFICATE.findall(pem)
    if blocks:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=b"\n".join(blocks).decode("ascii"))
            return
        except ssl.SSLError as error:  # a damaged certificate: OpenSSL's reason, where it gives one
            reason = error.reason or "a certificate that does not parse"
    elif pem.strip() and not pem.isascii():
        reason = "a binary file; a DER certificate converts with `openssl x509 -inform DER -in FILE -out FILE.pem`"
    else:
        reason = "no certificate in it"
    raise SecurityError(ErrorCode.INVALID_CONFIG, f"{named} is not a PEM CA bundle ({reason}){advice}")


_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]*-----END CERTIFICATE-----")
"""One PEM certificate block (base64 between its markers), as OpenSSL's PEM reader finds them in a bundle."""


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


# -- HTTP (ASGI) ----------------------------------------------------------------------

HTTP_UNAUTHENTICATED_PATHS = frozenset({"/health", "/ready", "/"})
"""Liveness and readiness stay open for probes, like gRPC health (http/auth.py's BearerAuthMiddleware), and so does
the playground page: a static file a browser cannot fetch with a bearer token; it sends the key, once typed, with
each request it makes."""
