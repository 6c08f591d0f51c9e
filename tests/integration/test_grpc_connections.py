"""The public gRPC endpoint under clients that connect and never speak: a handshake deadline and a cap.

Scenario: a daemon limited to 256 descriptors (so its public endpoint takes at most 90 connections, the half
of the spare descriptors the HTTP API leaves), 120 connections opened at once that never finish their
HTTP/2 handshake. The ones past the cap are closed at once, the others at the handshake deadline, the
daemon's descriptors come back, and a synthesis call is answered afterwards.
"""

from __future__ import annotations

import socket

import psutil
import pytest

from stagevisor.supervisor.dataplane.synthesis import PUBLIC_HANDSHAKE_TIMEOUT_MS
from stagevisor.supervisor.http.connections import fd_budget
from tests.integration.daemon_helpers import closed_by_server, descriptor_limited_daemon, poll_until, synthesize

NOFILE = 256
SILENT = 120


@pytest.mark.slow  # waits out the handshake deadline
def test_silent_grpc_connections_are_capped_then_closed_at_the_handshake_deadline():
    cap = fd_budget(NOFILE, workers=1).http_connections
    assert cap < SILENT
    daemon = descriptor_limited_daemon("silent-clients", NOFILE, "--http", "none")
    with daemon:
        daemon.wait_serving()
        baseline = psutil.Process(daemon.pid).num_fds()
        path = daemon.listen.removeprefix("unix:")
        silent = []
        try:
            for _ in range(SILENT):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(path)
                sock.setblocking(False)
                silent.append(sock)
            # Past the cap, connections are closed as they come; before the handshake deadline passes.
            poll_until(
                lambda: sum(closed_by_server(s) for s in silent) >= SILENT - cap,
                timeout=PUBLIC_HANDSHAKE_TIMEOUT_MS / 1000 * 0.8,
                message=f"the {SILENT - cap} connections past the cap of {cap} closed",
            )
            poll_until(
                lambda: all(closed_by_server(s) for s in silent),
                timeout=PUBLIC_HANDSHAKE_TIMEOUT_MS / 1000 + 20,
                message="every silent connection closed at the handshake deadline",
            )
        finally:
            for sock in silent:
                sock.close()
        poll_until(
            lambda: psutil.Process(daemon.pid).num_fds() <= baseline + 4,
            timeout=30,
            message=f"the daemon's descriptors back near {baseline}",
        )
        pcm, _ = synthesize(daemon.listen, "still answering")
        assert pcm
