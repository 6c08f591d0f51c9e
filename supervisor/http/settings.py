"""The HTTP server's settings as `serve` takes them: connection limits, accepted Host names, CORS origins.

Pure data (no uvicorn import): the CLI builds it while parsing, and
http/connections.py and http/server.py apply it.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass(frozen=True)
class ConnectionLimits:
    """How long an HTTP client may take to send its request, how long it may idle, how many may be open."""

    header_timeout: float = 10.0
    """Seconds from a connection's start (or the end of its previous response) to a complete request head."""
    body_timeout: float = 30.0
    """Seconds from the request head to the end of the body."""
    keep_alive_timeout: float = 5.0
    """Seconds an idle keep-alive connection stays open after a response."""
    max_connections: int | None = None
    """Open connections at once; None: derived from the descriptor budget (`fd_budget`)."""

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Host headers accepted by default: loopback names on a loopback bind (against DNS rebinding), else any."""
    if bind_host == "localhost":
        return list(LOOPBACK_HOSTS)
    try:
        loopback = ipaddress.ip_address(bind_host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    return list(LOOPBACK_HOSTS) if loopback else ["*"]


def is_origin(text: str) -> bool:
    """Whether `text` is a web origin exactly as a browser's Origin header carries it: `http(s)://host[:port]`.

    CORS compares origins as strings, so `https://app.example.com/` (a trailing slash) would never match.
    """
    try:
        parts = urlsplit(text)
        port = parts.port  # raises on a port that is not a number from 0 to 65535
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not (parts.path or parts.query or parts.fragment or parts.username or parts.password)
        and text == f"{parts.scheme}://{parts.netloc}"
        and (port is None or port > 0)
    )


@dataclass(frozen=True)
class HttpSettings:
    """What `serve`'s --http-* options set: connection limits, the Host names accepted, CORS origins."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    allowed_hosts: tuple[str, ...] = ()
    """Host header values accepted (`*.example.com` patterns, `*` for any); empty: `default_allowed_hosts`."""
    cors_origins: tuple[str, ...] = ()
    """Browser origins allowed cross-origin requests; empty: no CORS headers at all."""

    def __post_init__(self) -> None:
        for pattern in self.allowed_hosts:
            if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*" and not pattern.startswith("*.")):
                raise ValueError(
                    f"allowed_host {pattern!r} is not a host name or pattern: use `*` alone or a leading "
                    "`*.` (e.g. *.example.com)"
                )

        for origin in self.cors_origins:
            if origin != "*" and not is_origin(origin):
                raise ValueError(
                    f"cors_origin {origin!r} is not an origin as a browser sends it: give scheme://host[:port] "
                    "(e.g. https://app.example.com, no path, no trailing slash), or `*` for any"
                )

    def hosts_for(self, bind_host: str) -> list[str]:
        return list(self.allowed_hosts) or default_allowed_hosts(bind_host)
