"""Buffers that travel outside a frame's message: which ones do (`DEFAULT_SHM_THRESHOLD`), what a sender put
out of line (`OutOfLine`: pooled shared-memory writes, inline Piece frames), where a receiver resolves them
(`BufferSource`), and handing back those of a frame that is never decoded (`discard_shared`).

Each pooled buffer of a received frame is released to its sender exactly once: `take` marks in the frame
itself which buffers someone has already taken on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import cuda_ipc

DEFAULT_SHM_THRESHOLD = 256 * 1024
"""Bytes at which a tensor or bytes value leaves the message (shared memory, or inline pieces)."""
PIECE_BYTES = 1024 * 1024
"""Largest Piece of an inline buffer: small enough to interleave with other requests' frames."""


class BufferSource(Protocol):
    """Where a frame came from, for the buffers it refers to (an InboundLink)."""

    def release(self, name: str) -> None:
        """Tell the sender a pooled buffer (its SharedBuffer.name: one write's token) is free again (callable from
        any thread)."""

    def take_inline(self, buffer_id: str, size: int) -> bytearray:
        """The assembled Pieces of an inline buffer; raises CodecError when incomplete or unknown."""

    def discard_inline(self, buffer_id: str) -> None:
        """Forget an inline buffer whose frame is dropped."""


@dataclass
class OutOfLine:
    """What the last encodes put outside their messages, for the sender to account for."""

    segments: Sequence[str] = ()
    """Pooled writes (SegmentPool tokens): the sender waits for their Release on the link the frame goes out on."""
    pieces: Sequence[tuple[str, memoryview]] = ()
    """Inline buffers (id, bytes): sent as Piece frames right before the frame."""

    def __bool__(self) -> bool:
        return bool(self.segments or self.pieces)


NOTHING_OUT_OF_LINE = OutOfLine()
"""What `take_out_of_line` returns when the encodes put nothing out of line (shared, never to be filled)."""


def piece_frames(
    request_id: str, pieces: Sequence[tuple[str, memoryview]], piece_bytes: int = PIECE_BYTES
) -> Iterator[pb.Frame]:
    """The Piece frames carrying inline buffers, in order."""
    for buffer_id, view in pieces:
        total = view.nbytes
        for offset in range(0, total, piece_bytes):
            yield pb.Frame(
                request_id=request_id,
                piece=pb.Piece(
                    buffer=buffer_id, offset=offset, data=bytes(view[offset : offset + piece_bytes]), total=total
                ),
            )


def discard_shared(value: pb.Value, source: BufferSource | None = None) -> None:
    """Hand back every out-of-line buffer referenced in a Value that will never be decoded."""
    kind = value.WhichOneof("kind")
    if kind == "map":
        for item in value.map.values:
            discard_shared(item, source)
    elif kind == "list":
        for item in value.list.items:
            discard_shared(item, source)
    elif kind == "shared_raw":
        discard(value.shared_raw, source)
    elif kind == "tensor" and value.tensor.framework == cuda_ipc.FRAMEWORK:
        cuda_ipc.discard(value.tensor)
    elif kind == "tensor" and value.tensor.HasField("shared"):
        discard(value.tensor.shared, source)


def discard(shared: pb.SharedBuffer, source: BufferSource | None) -> None:
    if source is None:
        return
    if shared.inline:
        source.discard_inline(shared.name)
    elif take(shared):
        source.release(shared.name)


def take(shared: pb.SharedBuffer) -> bool:
    """Take a received pooled buffer's one Release on oneself: True the first time, False once taken (or
    never pooled).

    The mark is in the frame's own message (it stops being `pooled`), so whoever holds the frame later,
    decode or a drop of the whole frame, sees which of its buffers are already someone else's to release.
    """
    if not shared.pooled:
        return False
    shared.pooled = False
    return True
