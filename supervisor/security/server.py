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
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stagevisor.supervisor import envs
from stagevisor.supervisor.errors import ErrorCode
from stagevisor.supervisor.security.files import (
    SecurityError,
    check_key_pair,
    load_api_key,
    read_secret,
    refuse_unless_ca,
)

UNAUTHENTICATED_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
"""Health stays open (load balancer and kubernetes probes send no token); it reveals only SERVING or not."""


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
    if values[0].strip().partition(" ")[0].lower() != "bearer":  # `Basic ...`: no token was sent, let alone a wrong one
        return values[0], "an authorization header of another scheme than Bearer"
    return values[0], "a wrong bearer token"


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
        cert_pem = read_secret(cert_file, "TLS certificate", "--tls-cert")
        key_pem = read_secret(key_file, "TLS private key", "--tls-key")
        check_key_pair(cert_file, key_file, f"--tls-cert {cert_file} and --tls-key {key_file}")
    if tls_client_ca is not None:
        ca_file = Path(tls_client_ca)
        ca_pem = read_secret(ca_file, "client CA bundle", "--tls-client-ca")
        refuse_unless_ca(ca_pem, f"--tls-client-ca {ca_file}")
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
                f"(stagevisor CLI: --api-key-file or ${envs.API_KEY.name})",
            )

    return BearerAuthInterceptor


def bearer_interceptor(security: Security) -> Any:
    """A grpc.aio.ServerInterceptor enforcing `security`'s bearer token."""
    return _bearer_interceptor_class()(security)


# -- HTTP (ASGI) ----------------------------------------------------------------------

HTTP_UNAUTHENTICATED_PATHS = frozenset({"/health", "/ready", "/"})
"""Liveness and readiness stay open for probes, like gRPC health (http/auth.py's BearerAuthMiddleware), and so does
the playground page: a static file a browser cannot fetch with a bearer token; it sends the key, once typed, with
each request it makes."""
