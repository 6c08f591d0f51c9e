"""PieceAssembler: the inline buffers arriving in Pieces on one link, bounded in bytes, count and time.

A buffer too large for shared memory (or bound for another node) travels
inline, in Piece frames ahead of the frame that refers to it; the receiving
link assembles it here until that frame's decode takes it. What does not fit,
arrives out of order or is never claimed fails its request or is forgotten.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec_errors import CodecError

MAX_ASSEMBLING_BYTES = 512 * 1024 * 1024
"""Inline buffers one link may hold half-assembled or unclaimed; beyond it, pieces fail their request."""
MAX_ASSEMBLING_BUFFERS = 4096
PIECE_IDLE_SECONDS = 60.0
"""An inline buffer no piece or frame touched for this long is forgotten (its frame never came)."""


@dataclass
class _Assembly:
    request_id: str
    data: bytearray
    filled: int
    touched: float


class PieceAssembler:
    """Inline buffers arriving in Pieces on one link, bounded in bytes, count and time."""

    def __init__(
        self,
        max_bytes: int = MAX_ASSEMBLING_BYTES,
        max_buffers: int = MAX_ASSEMBLING_BUFFERS,
        idle: float = PIECE_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_buffers = max_buffers
        self.idle = idle
        self._clock = clock
        self._buffers: dict[str, _Assembly] = {}
        self.bytes = 0
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._buffers)

    def add(self, request_id: str, piece: pb.Piece) -> str | None:
        """Take one piece in; an error message (and the buffer forgotten) when it does not fit."""
        now = self._clock()
        self._expire(now)
        assembly = self._buffers.get(piece.buffer)
        if assembly is None:
            if piece.offset != 0:
                return f"a piece of inline buffer {piece.buffer[:40]!r} arrived without its start"
            if self.bytes + piece.total > self.max_bytes or len(self._buffers) >= self.max_buffers:
                return (
                    f"an inline buffer of {piece.total} bytes exceeds what a link may hold "
                    f"({self.max_bytes} bytes in {self.max_buffers} buffers)"
                )
            assembly = self._buffers[piece.buffer] = _Assembly(request_id, bytearray(piece.total), 0, now)
            self.bytes += piece.total
        end = piece.offset + len(piece.data)
        if (
            piece.offset != assembly.filled
            or end > len(assembly.data)
            or piece.total != len(assembly.data)
            or request_id != assembly.request_id
        ):
            self.discard(piece.buffer)
            return f"inline buffer {piece.buffer[:40]!r} arrived out of order or over its size"
        assembly.data[piece.offset : end] = piece.data
        assembly.filled = end
        assembly.touched = now
        return None

    def take(self, buffer_id: str, size: int) -> bytearray:
        assembly = self._buffers.pop(buffer_id, None)
        if assembly is None:
            raise CodecError(f"inline buffer {buffer_id[:40]!r} never arrived")
        self.bytes -= len(assembly.data)
        if assembly.filled != len(assembly.data) or len(assembly.data) != size:
            raise CodecError(f"inline buffer {buffer_id[:40]!r} is incomplete ({assembly.filled} of {size} bytes)")
        return assembly.data

    def discard(self, buffer_id: str) -> None:
        assembly = self._buffers.pop(buffer_id, None)
        if assembly is not None:
            self.bytes -= len(assembly.data)

    def clear(self) -> None:
        self._buffers.clear()
        self.bytes = 0

    def _expire(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        for buffer_id in [b for b, a in self._buffers.items() if now - a.touched > self.idle]:
            self.discard(buffer_id)
