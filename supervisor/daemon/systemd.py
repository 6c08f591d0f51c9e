"""sd_notify without libsystemd: send READY=1 / STOPPING=1 / STATUS=... to $NOTIFY_SOCKET.

A no-op when the daemon does not run under a `Type=notify` systemd unit.
"""

from __future__ import annotations

import os
import socket


def notify(*fields: str) -> bool:
    """Send `KEY=VALUE` lines to systemd; return False when there is no $NOTIFY_SOCKET or it fails."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not fields:
        return False
    if address.startswith("@"):  # abstract namespace socket
        address = "\0" + address[1:]
    payload = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(payload)
        return True
    except OSError:
        # Readiness notification is best effort: systemd times the unit out if it matters.
        return False


class StatusLine:
    """The daemon's STATUS= line to systemd, sent once per change: `tell` sends a status unless it is the one last
    sent (other fields, such as READY=1, always go out, with the status in the same datagram)."""

    def __init__(self) -> None:
        self.last = ""
        """The STATUS= line systemd was last sent."""

    def tell(self, status: str, *fields: str) -> None:
        if fields or status != self.last:
            self.last = status
            notify(*fields, status)
