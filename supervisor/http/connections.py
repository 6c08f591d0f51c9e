"""The HTTP server's connection limits: header and body read deadlines, a cap on open connections, the fd budget.

uvicorn closes an idle keep-alive connection (`timeout_keep_alive`) but gives
a client as long as it likes to send its request: 200 connections trickling
headers at a byte a second hold 200 descriptors for ever. `guarded_protocol`
returns uvicorn's h11 protocol with two deadlines (the request head must
arrive within `header_timeout` of the connection opening or of the previous
response ending; the body within `body_timeout` of the head; a client that sent part
of its request by then is answered 408 before the close) and a cap on open
connections: at the cap, a new connection evicts the oldest one still
waiting for its request head (a slow or idle client); when every open connection is
busy with a request, it takes one of PROBE_RESERVE places past the cap, where a
health probe is answered and any other request gets 503 with Retry-After, or is
closed at once when those are taken too. `fd_budget` derives that
cap from RLIMIT_NOFILE, after what the daemon's other users of descriptors
(gRPC, worker links, shared memory, logs) are given. The protocol also names
its transport to the requests it starts (backlog.py).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, STATUS_PHRASES, H11Protocol

from stagevisor.supervisor.http import backlog
from stagevisor.supervisor.http.errors import ApiError, refuse
from stagevisor.supervisor.http.settings import ConnectionLimits
from stagevisor.supervisor.http.targets import routed_path

log = logging.getLogger("stagevisor.http")

RESERVED_FDS = 64
"""Descriptors kept for the daemon itself: stdio, logs, the event loop, the admin and public gRPC listeners."""
FDS_PER_WORKER = 12
"""Per worker process: its handshake and lifeline pipes, heartbeat, link sockets both ways, pooled shm segments."""
HTTP_SHARE = 0.5
"""Of what is left, the HTTP server's connections take half; public gRPC connections and bursts the other half."""
MIN_HTTP_CONNECTIONS = 8
MAX_HTTP_CONNECTIONS = 4096
PROBE_RESERVE = 4
"""Connections past the cap, taken only when every connection under it is busy with a request: each answers a
health probe (GET or HEAD of PROBE_PATHS) and 503 `too_many_connections` to anything else, then closes. Without
them a busy daemon reset its load balancer's probes, which then took it for down."""
PROBE_PATHS = ("/health", "/ready")
RETRY_AFTER_BUSY = 1
"""Seconds a request refused past the cap is told to wait (`Retry-After`): short, as a place under the cap frees
whenever any response ends (a choice, not a measured figure)."""


@dataclass(frozen=True)
class FdBudget:
    """How the process's descriptor limit is shared: what is reserved, and the HTTP connection cap."""

    limit: int
    reserved: int
    http_connections: int

    @property
    def needed(self) -> int:
        """The fewest descriptors the daemon runs on: its reserve and the smallest HTTP connection cap."""
        return self.reserved + MIN_HTTP_CONNECTIONS

    @property
    def short(self) -> bool:
        return self.limit < self.needed

    def describe(self) -> str:
        if self.short:
            return (
                f"descriptors: limit {self.limit} is below the {self.needed} this daemon needs for gRPC, worker "
                "links, shared memory and HTTP; requests will fail with 'Too many open files'. Raise it to at "
                "least that (ulimit -n, systemd LimitNOFILE=, docker run --ulimit nofile=)"
            )
        return (
            f"descriptors: limit {self.limit}, {self.reserved} kept for gRPC, worker links and shared memory, "
            f"up to {self.http_connections} HTTP connections"
        )


def nofile_limit() -> int:
    """The soft RLIMIT_NOFILE, raised to the hard limit first where it is lower (as most servers do)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def fd_budget(limit: int, workers: int) -> FdBudget:
    """Share `limit` descriptors: the daemon's reserve and `workers`' links first, HTTP_SHARE of the rest to HTTP."""
    reserved = RESERVED_FDS + FDS_PER_WORKER * max(0, workers)
    spare = max(0, limit - reserved)
    http = int(spare * HTTP_SHARE)
    return FdBudget(limit, reserved, max(MIN_HTTP_CONNECTIONS, min(MAX_HTTP_CONNECTIONS, http)))


class _Registry:
    """The open connections of one server, oldest first (dicts keep insertion order)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: dict[Any, None] = {}
        self.reserve: dict[Any, None] = {}
        """Connections let in past the cap to answer a health probe (PROBE_RESERVE at most)."""


class ProbesOnly:
    """ASGI app of a connection let in past the cap: a health probe is served (its response closes the
    connection), anything else is answered 503 `too_many_connections` with Retry-After, a WebSocket handshake
    included."""

    def __init__(self, app: Any, cap: int) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD") and routed_path(scope) in PROBE_PATHS:

            async def closing(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
                await send(message)

            await self.app(scope, receive, closing)
            return
        await refuse(self.error(), scope, receive, send)

    def error(self) -> ApiError:
        """The answer to a request other than a health probe."""
        return ApiError(
            503,
            f"every HTTP connection the daemon takes ({self.cap}, --http-max-connections) is busy with a request; "
            f"retry in {RETRY_AFTER_BUSY} s (GET /health and /ready are still answered)",
            code="too_many_connections",
            headers={"Retry-After": str(RETRY_AFTER_BUSY), "Connection": "close"},
        )


def guarded_protocol(limits: ConnectionLimits, cap: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the request head and body deadlines of `limits` and at most `cap` connections."""
    registry = _Registry(cap)

    class GuardedH11Protocol(H11Protocol):
        """H11Protocol plus read deadlines and the connection cap (one class per server: it holds the registry)."""

        _upgraded = False
        """Set once the connection became a WebSocket session: no read deadline applies from then on."""
        _phase: str | None = None
        """The read deadline armed now: "request head", "request body", or None."""
        _deadline: asyncio.TimerHandle | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _RefusalKeeping(h11.SERVER, self._head_limit())

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # asyncio gives a stream protocol a Transport; uvicorn's H11Protocol declares the narrower type.
            super().connection_made(cast(asyncio.Transport, transport))
            if len(registry.open) >= registry.cap and not self._evict_one():
                if len(registry.reserve) >= PROBE_RESERVE:
                    log.warning(
                        "HTTP: %d connections open (the cap) and %d more for health probes; closing a new one",
                        registry.cap,
                        PROBE_RESERVE,
                    )
                    transport.close()
                    return
                # Every connection is busy with a request: this one answers a health probe, else a 503.
                self.app = ProbesOnly(self.app, registry.cap)
                registry.reserve[self] = None
            else:
                registry.open[self] = None
            self._arm(limits.header_timeout, "request head")

        def connection_lost(self, exc: Exception | None) -> None:
            registry.open.pop(self, None)
            registry.reserve.pop(self, None)
            self._disarm()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            # The connection becomes a WebSocket session with its own idle limit (--stream-idle-timeout): no
            # read deadline may cut it, no newcomer evict it. It still counts toward the cap until it closes;
            # the transport then reports to the WebSocket protocol, not to this one.
            if isinstance(self.app, ProbesOnly):  # past the cap: the session would bypass the probes-only app
                self._disarm()
                self._answer_and_close(self.app.error())
                return
            self._upgraded = True
            self._disarm()
            super().handle_websocket_upgrade(event)
            session = self.transport.get_protocol()
            session_lost = session.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                registry.open.pop(self, None)
                registry.reserve.pop(self, None)
                session_lost(exc)

            session.connection_lost = connection_lost  # type: ignore[method-assign]

        def data_received(self, data: bytes) -> None:
            # The tasks a request starts (its ASGI call, a WebSocket session) know their connection: their writes
            # read its backlog while they wait, so a client that reads slowly is not taken for an idle one.
            with backlog.serving(self.transport):
                super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def send_400_response(self, msg: str) -> None:
            """h11 refused the request as malformed: the API's envelope, not uvicorn's text/plain 400; and 431 (RFC
            6585) where the request head passed h11's bound before it ended, as for too many or too long headers; 501
            (RFC 9112 section 6.1) for a Transfer-Encoding other than chunked."""
            buffered, _ = self.conn.trailing_data
            refusal = self.conn.refusal if isinstance(self.conn, _RefusalKeeping) else None
            if refusal is not None and refusal.error_status_hint == 501:
                # RFC 9112 section 6.1: a transfer coding the server does not understand is a 501. h11 reads
                # chunked alone (and a Content-Length), and refuses any other coding, or two Transfer-Encodings.
                error = ApiError(
                    501,
                    "the request's Transfer-Encoding is not one this server reads: send the body with "
                    "`Transfer-Encoding: chunked` alone, or with a Content-Length",
                    code="unsupported_transfer_encoding",
                )
            elif len(buffered) > self._head_limit():
                error = ApiError(
                    431,
                    f"the request's line and headers passed {self._head_limit()} bytes before they ended; send fewer "
                    "or shorter headers",
                    code="request_header_fields_too_large",
                )
            else:
                error = ApiError(
                    400,
                    "the request is not valid HTTP/1.1: check its request line and headers",
                    code="invalid_http_request",
                )
            self._answer_and_close(error)

        def _answer_and_close(self, error: ApiError) -> None:
            """Answer `error` in the API's envelope with `Connection: close`, and close once it is written."""
            body = bytes(error.response().body)  # as every other answer of the API renders it
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            answer = h11.Response(status_code=error.status, headers=headers, reason=STATUS_PHRASES[error.status])
            for event in (answer, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event) or b"")
            self.transport.close()

        def _head_limit(self) -> int:
            configured = self.config.h11_max_incomplete_event_size
            return configured if configured is not None else DEFAULT_MAX_INCOMPLETE_EVENT_SIZE

        # -- deadlines ---------------------------------------------------------

        def _follow(self) -> None:
            """Re-arm the deadline for the phase the client is in now."""
            if self.transport.is_closing() or self._upgraded:
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY:
                if self._phase != "request body":
                    self._arm(limits.body_timeout, "request body")
            elif state is h11.IDLE:
                if self._phase != "request head" and (self.cycle is None or self.cycle.response_complete):
                    self._arm(limits.header_timeout, "request head")
            else:
                self._disarm()  # the app has the whole request; --request-timeout governs the response

        def _arm(self, seconds: float, phase: str) -> None:
            self._disarm()
            self._phase = phase
            self._deadline = self.loop.call_later(seconds, self._expired, phase, seconds)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = None
            self._phase = None

        def _expired(self, phase: str, seconds: float) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            log.info("HTTP: closing a connection from %s: its %s took over %gs", _peer(self.client), phase, seconds)
            answer = None
            if self._request_begun() and (self.cycle is None or not self.cycle.response_started):
                # RFC 9110 section 15.5.9: the request did not arrive in the time the server waits. A connection
                # that sent nothing has no request to answer (a 408 could be taken for the answer to a request
                # sent as it closes), and one whose response began can only be cut.
                head = phase == "request head"
                answer = ApiError(
                    408,
                    f"the request's {'request line and headers' if head else 'body'} did not arrive within "
                    f"{seconds:g} s ({'--http-header-timeout' if head else '--http-body-timeout'}); send it "
                    "whole, on a new connection",
                    code="request_timeout",
                )
            self._expire_now(phase, answer)  # an app reading the body sees the client gone: its answer goes nowhere

        def _request_begun(self) -> bool:
            """Whether the client sent part of a request: some of its head (h11 holds it until it ends), or all of
            it (its body is due). A connection that sent nothing has no request to answer."""
            return self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])

        def _reading_request(self) -> str | None:
            """ "request head" or "request body" while the client still owes its request; None once it is in."""
            return self._phase

        def _evict_one(self) -> bool:
            """Close the oldest connection still owing its request head, else the oldest owing its body (slow
            clients); False when every open connection has sent its whole request (those are never cut)."""
            for phase in ("request head", "request body"):
                for other in registry.open:
                    if other._reading_request() == phase:
                        log.info(
                            "HTTP: at the cap of %d connections; closing one from %s still sending its %s",
                            cap,
                            _peer(other.client),
                            phase,
                        )
                        registry.open.pop(other, None)
                        other._expire_now(phase)
                        return True
            return False

        def _expire_now(self, phase: str, answer: ApiError | None = None) -> None:
            self._disarm()
            if phase == "request body" and self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            if answer is not None:
                self._answer_and_close(answer)
            else:
                self.transport.close()

    return GuardedH11Protocol


class _RefusalKeeping(h11.Connection):
    """h11's connection, keeping the protocol error it refused the client's request with: uvicorn answers every
    refusal 400 and drops the error, whose `error_status_hint` tells a 501 (an unknown Transfer-Encoding) apart."""

    refusal: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as error:
            self.refusal = error
            raise


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
