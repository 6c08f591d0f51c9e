"""The data tree of a StagePayload <-> the `stagevisor.v1.Value` proto, for cross-process edges.

Supported: None, bool, int, float, str, bytes (bytearray/memoryview arrive as
bytes), list and tuple (arrive as list), dict with str keys (insertion order
kept), numpy arrays and scalars, and torch tensors where torch is importable.
Tensors keep dtype and shape. torch is imported only when a torch tensor is
actually encoded or decoded.

Small, common trees (dicts, lists, scalars, strings, bytes and numpy arrays
under the shared-memory threshold) travel packed: the whole tree as one bytes
field, one msgpack document (see packed.py), built and read by msgpack's C
extension instead of a protobuf message per node. Any other tree (torch tensors, large buffers,
subclasses, ints beyond 64 bits) is a Value tree, node by node; either way
the receiver gets the same objects.

Buffers of at least `shm_threshold` bytes do not go inside the message: with
a shared-memory area they are written once into a pooled file (see shm.py)
and the receiver maps them; without one (or when the area is full) they go
inline, as Piece frames sent ahead of the frame on the same link (see
`take_out_of_line`), so no gRPC message size limit applies either way.

Decoding checks what a peer sent instead of trusting it: dtype, shape and
byte counts must agree, and shared buffers are opened only as shm.py allows;
anything else is a CodecError that fails only the request the frame carried.
Each pooled buffer of a received frame is released to its sender exactly
once, whether the frame decodes, fails halfway, or is dropped after it
decoded: decode marks in the frame what it took (see `Codec.decode`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable

import numpy as np

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import cuda_ipc, shm
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.decoding import Decoder
from stagevisor.supervisor.dataplane.dtypes import dtype_str, is_torch_tensor
from stagevisor.supervisor.dataplane.out_of_line import (
    DEFAULT_SHM_THRESHOLD,
    NOTHING_OUT_OF_LINE,
    OutOfLine,
)
from stagevisor.supervisor.dataplane.packed import pack

__all__ = ["EXPIRY_SLACK", "Codec"]
"""What importers use: the Codec, and (from the modules it is made of) its errors and out-of-line vocabulary."""

log = logging.getLogger(__name__)

EXPIRY_SLACK = 0.5
"""Seconds after a pool's peak window ends before its idle trim runs (so the window is surely past)."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_buffer_ids = itertools.count()


class Codec(Decoder):
    """Encodes and decodes data trees; one per worker (it owns the shared-memory name prefix)."""

    def __init__(
        self,
        area: shm.SharedArea | None = None,
        shm_threshold: int = DEFAULT_SHM_THRESHOLD,
        pieces: bool = False,
        cuda: cuda_ipc.CudaIpc | None = None,
        packed: bool = True,
    ) -> None:
        super().__init__(area)
        self.packed = packed
        """Whether dicts, lists and arrays that packed.py covers travel packed (False: always a Value tree)."""
        self.shm_threshold = shm_threshold
        self.pieces = pieces
        """Large buffers without shared memory go in Piece frames (a link sender); else inside the message."""
        self.pool = shm.SegmentPool(area) if area is not None else None
        """Reusable shared buffers (see SegmentPool); None: large buffers go inline in pieces."""
        self._expiry: asyncio.TimerHandle | None = None
        self._segments: list[str] = []
        """What the encodes since the last take_out_of_line put out of line: pooled files, inline pieces."""
        self._pieces: list[tuple[str, memoryview]] = []
        self._pool_failed = False
        self.cuda = cuda
        """CUDA IPC policy: CUDA tensors for a worker on the same GPU go by handle (see cuda_ipc.py)."""
        self._peer: str | None = None
        self.remote: Callable[[str | None], bool] | None = None
        """Whether a destination runs on another node (peers.PeerDirectory.remote): nothing goes to it by shared
        memory or CUDA IPC, its large buffers go inline. None: every destination shares this node."""
        self._encoders: dict[type, Callable[[Any, pb.Value, Any], None]] = {
            type(None): self._none,
            bool: self._bool,
            int: self._int,
            float: self._float,
            str: self._str,
            bytes: self._bytes,
            bytearray: self._bytes,
            memoryview: self._bytes,
            list: self._list,
            tuple: self._list,
            dict: self._dict,
            np.ndarray: self._ndarray,
        }

    # ---- encoding -----------------------------------------------------------------

    def encode(self, obj: Any) -> pb.Value:
        """A Value message for `obj`; raises CodecError naming the path of an unsupported node."""
        value = pb.Value()
        self._encode_value(obj, value)
        return value

    def encode_into(self, obj: Any, value: pb.Value, peer: str | None = None) -> None:
        """Encode `obj` into an existing (sub)message, avoiding a copy of the tree; `peer` is the destination."""
        self._peer = peer
        try:
            self._encode_value(obj, value)
        finally:
            self._peer = None

    def _encode_value(self, obj: Any, value: pb.Value) -> None:
        # Containers and arrays are packed when packed.py covers the whole tree; a lone scalar is
        # one Value field either way.
        if self.packed and obj.__class__ in _PACKED_ROOTS:
            try:
                value.packed = pack(obj, self.shm_threshold)
                return
            except Exception:  # noqa: BLE001 - not packable (Unpackable, or what the Value tree names): node by node
                pass
        self._encode_into(obj, value, "data")

    def _encode_into(self, obj: Any, value: pb.Value, path: Any) -> None:
        # `path` is "data" or (parent path, "[key]"): formatted only when an error names it.
        encoder = self._encoders.get(type(obj))
        if encoder is not None:
            encoder(obj, value, path)
        elif isinstance(obj, np.generic):
            self._tensor(np.asarray(obj), value, "numpy-scalar")
        elif is_torch_tensor(obj):
            self._torch(obj, value)
        elif isinstance(obj, np.ndarray):
            self._ndarray(obj, value, path)
        elif isinstance(obj, dict):
            self._dict(obj, value, path)
        elif isinstance(obj, (list, tuple)):
            self._list(obj, value, path)
        elif isinstance(obj, (bool, int, float, str, bytes)):
            self._encoders[next(t for t in (bool, int, float, str, bytes) if isinstance(obj, t))](obj, value, path)
        else:
            raise CodecError(
                f"{_path(path)}: {type(obj).__qualname__} cannot cross a process boundary; use None, bool, "
                "int, float, str, bytes, list, dict with str keys, or a numpy/torch tensor"
            )

    @staticmethod
    def _none(obj: Any, value: pb.Value, path: str) -> None:
        value.none = True

    @staticmethod
    def _bool(obj: bool, value: pb.Value, path: str) -> None:
        value.boolean = obj

    @staticmethod
    def _int(obj: int, value: pb.Value, path: str) -> None:
        if _INT64_MIN <= obj <= _INT64_MAX:
            value.integer = obj
        else:
            value.big_integer = str(int(obj))

    @staticmethod
    def _float(obj: float, value: pb.Value, path: str) -> None:
        value.real = obj

    @staticmethod
    def _str(obj: str, value: pb.Value, path: str) -> None:
        value.text = obj

    def _bytes(self, obj: Any, value: pb.Value, path: str) -> None:
        if len(obj) < self.shm_threshold or not self._share(memoryview(obj).cast("B"), lambda: value.shared_raw):
            value.raw = bytes(obj)

    def _list(self, obj: Any, value: pb.Value, path: Any) -> None:
        add = value.list.items.add
        encode = self._encode_into
        for index, item in enumerate(obj):
            encode(item, add(), (path, index))
        if not obj:
            value.list.SetInParent()

    def _dict(self, obj: dict[Any, Any], value: pb.Value, path: Any) -> None:
        mapping = value.map
        mapping.SetInParent()
        append, add = mapping.keys.append, mapping.values.add
        encoders = self._encoders
        for key, item in obj.items():
            if key.__class__ is not str and not isinstance(key, str):
                raise CodecError(
                    f"{_path(path)}: key {key!r} is a {type(key).__qualname__}; only str keys cross processes"
                )
            append(key)
            # The common leaves directly; anything else through the general dispatch.
            encoder = encoders.get(item.__class__)
            if encoder is not None:
                encoder(item, add(), (path, key))
            else:
                self._encode_into(item, add(), (path, key))

    def _ndarray(self, obj: np.ndarray, value: pb.Value, path: Any) -> None:
        dtype = obj.dtype
        if dtype.hasobject:
            raise CodecError(f"{_path(path)}: numpy arrays of dtype object cannot cross a process boundary")
        self._tensor(obj, value, "numpy")

    def _tensor(self, array: np.ndarray, value: pb.Value, framework: str, dtype: str | None = None) -> None:
        tensor = value.tensor
        tensor.framework = framework
        tensor.dtype = dtype or dtype_str(array.dtype)
        tensor.shape.extend(array.shape)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if array.nbytes < self.shm_threshold or not self._share(
            array.reshape(-1).data.cast("B"), lambda: tensor.shared
        ):
            tensor.data = array.tobytes()

    def take_out_of_line(self) -> OutOfLine:
        """What went outside the messages since the last call; the sender must send or drop it.

        Pieces must be sent, on the link the frame goes out on, before the
        frame; segments are held by that link until their Release comes back.
        """
        if not self._segments and not self._pieces:
            return NOTHING_OUT_OF_LINE  # the usual case: no allocation per frame
        out = OutOfLine(self._segments, self._pieces)
        self._segments, self._pieces = [], []
        return out

    def _share(self, view: memoryview, shared: Callable[[], pb.SharedBuffer]) -> bool:
        """Put a large buffer out of line; False when it must go inside the message after all."""
        if self.pool is not None and (self.remote is None or not self.remote(self._peer)):
            try:
                name = self.pool.write(view)
            except OSError as error:
                # A full tmpfs (ENOSPC) or no fd left (EMFILE): slower, never wrong.
                (log.debug if self._pool_failed else log.warning)(
                    "shared memory unavailable (%s); sending a %d-byte buffer inline", error, view.nbytes
                )
                self._pool_failed = True
            else:
                self._segments.append(name)
                shared().MergeFrom(pb.SharedBuffer(name=name, size=view.nbytes, pooled=True))
                return True
        if not self.pieces:
            return False
        buffer_id = f"i{next(_buffer_ids)}"
        self._pieces.append((buffer_id, view))
        shared().MergeFrom(pb.SharedBuffer(name=buffer_id, size=view.nbytes, inline=True))
        return True

    def release(self, names: Any) -> None:
        """The receiver is done with these pooled writes (tokens; a Release frame arrived)."""
        if self.pool is not None:
            for name in names:
                self.pool.release(name)
            self._expire_later()

    def drop(self, names: Any) -> None:
        """These pooled writes (tokens) will never be released (their link broke, or their frame was never sent)."""
        if self.pool is not None:
            for name in names:
                self.pool.drop(name)

    async def released(self, timeout: float) -> None:
        """Wait up to `timeout` seconds until the receivers released every pooled write. A stopping worker's last
        frames may still be on their way: its pool unlinked before they arrive, a receiver cannot open their files
        and fails the request ("cannot open shared buffer")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.pool is not None and self.pool.busy() and loop.time() < deadline:
            await asyncio.sleep(0.01)

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.pool is not None:
            self.pool.close()

    def _expire_later(self) -> None:
        """When the pool keeps free files for a recent peak, trim it once that peak is past, on the running
        event loop: a sender that goes idle after a burst (a fault, a spike) then gives the burst's shared
        memory back instead of holding it until its next request."""
        if self._expiry is not None or self.pool is None:
            return
        delay = self.pool.surplus_expires_in()
        if delay is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # encoding outside an event loop (tests, tools): trimmed on the next use instead
            return
        self._expiry = loop.call_later(delay + EXPIRY_SLACK, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        if self.pool is not None:
            self.pool.expire()
            self._expire_later()  # a peak renewed meanwhile: look again when it is past

    def _torch(self, obj: Any, value: pb.Value) -> None:
        import torch  # only reached when a torch tensor is being encoded

        if (
            obj.is_cuda
            and self.cuda is not None
            and self.cuda.shares_with(self._peer)
            and (self.remote is None or not self.remote(self._peer))
        ):
            if self.cuda.encode(obj, value.tensor):
                return
        tensor = obj.detach().cpu().contiguous()
        try:
            self._tensor(tensor.numpy(), value, "torch")
        except TypeError:
            # A dtype numpy lacks (bfloat16, float8...): ship the bits as an int view.
            width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
            self._tensor(tensor.view(width).numpy(), value, "torch", dtype=str(tensor.dtype))


def _path(path: Any) -> str:
    """The path of a node for messages: "data", then "[index]" or "[key]" per level ("data['a'][0]")."""
    parts = []
    while isinstance(path, tuple):
        path, key = path
        parts.append(f"[{key!r}]")
    return str(path) + "".join(reversed(parts))


_PACKED_ROOTS = frozenset((dict, list, tuple, np.ndarray))
"""Types of a tree's root that are tried packed."""
