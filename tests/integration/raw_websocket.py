"""WebSocket frames written by hand, for tests whose client must control every byte it sends and reads."""

from __future__ import annotations

import os


def masked_text_frame(text: str) -> bytes:
    """One client-to-server text frame (RFC 6455 5.2: a client masks what it sends)."""
    payload = text.encode()
    mask = os.urandom(4)
    length = bytes([0x80 | len(payload)]) if len(payload) < 126 else bytes([0x80 | 126]) + len(payload).to_bytes(2)
    return bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
