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
import math
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from stagevisor.supervisor.errors import install_command
from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import cuda_ipc, shm
from stagevisor.supervisor.dataplane.packed import PackError, pack, unpack

log = logging.getLogger(__name__)

DEFAULT_SHM_THRESHOLD = 256 * 1024
"""Bytes at which a tensor or bytes value leaves the message (shared memory, or inline pieces)."""
PIECE_BYTES = 1024 * 1024
"""Largest Piece of an inline buffer: small enough to interleave with other requests' frames."""
EXPIRY_SLACK = 0.5
"""Seconds after a pool's peak window ends before its idle trim runs (so the window is surely past)."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FRAMEWORKS = ("numpy", "numpy-scalar", "torch")
_buffer_ids = itertools.count()
_shared_mapped_bytes = 0
_inline_taken_bytes = 0


def shared_bytes_received() -> int:
    """Bytes this process has mapped from shared buffers so far (a running total, for metrics)."""
    return _shared_mapped_bytes


def inline_bytes_received() -> int:
    """Bytes of large buffers this process has taken from inline pieces so far (a running total, for metrics)."""
    return _inline_taken_bytes


class CodecError(TypeError):
    """A value in `data` cannot cross a process boundary; the message says where and what."""


class TorchMissing(CodecError):
    """A torch tensor came to a process without torch installed; the message names the extra to install."""


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


class Codec:
    """Encodes and decodes data trees; one per worker (it owns the shared-memory name prefix)."""

    def __init__(
        self,
        area: shm.SharedArea | None = None,
        shm_threshold: int = DEFAULT_SHM_THRESHOLD,
        pieces: bool = False,
        cuda: cuda_ipc.CudaIpc | None = None,
        packed: bool = True,
    ) -> None:
        self.area = area
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
        elif _is_torch_tensor(obj):
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
        tensor.dtype = dtype or _dtype_str(array.dtype)
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

    # ---- decoding -----------------------------------------------------------------

    def decode(self, value: pb.Value, source: BufferSource | None = None) -> Any:
        """The Python object a Value stands for; CodecError when the Value is malformed.

        A pooled buffer is mapped from this process's area and released to
        `source` once nothing uses it any more (from whatever thread drops the
        last array). An inline buffer is taken from `source`'s assembled pieces.

        Each pooled buffer decode reaches is marked taken in `value` itself
        (see `_take`), whether decode returns or raises: it is released exactly
        once, by decode or by the finalizer of its mapping. A `discard_shared`
        of the same Value afterwards (the frame is dropped because decode
        failed, or because something failed after it) releases only the
        buffers decode never reached. A second decode of the same Value refuses
        its pooled buffers. A CUDA IPC handle is marked the same way once it is
        rebuilt: its storage gives the sender's count back, not a later drop.
        """
        kind = value.WhichOneof("kind")
        if kind == "packed":
            try:
                return unpack(value.packed, _array_dtype)
            except PackError as error:
                raise CodecError(str(error)) from None
        if kind == "map":
            mapping = value.map
            keys, values = mapping.keys, mapping.values
            if len(keys) != len(values):
                raise CodecError(f"map with {len(keys)} keys and {len(values)} values")
            decode = self.decode
            return {key: decode(item, source) for key, item in zip(keys, values, strict=True)}
        if kind == "text":
            return value.text
        if kind == "integer":
            return value.integer
        if kind == "real":
            return value.real
        if kind == "tensor":
            return self._decode_tensor(value.tensor, source)
        if kind == "list":
            return [self.decode(item, source) for item in value.list.items]
        if kind == "raw":
            return value.raw
        if kind == "boolean":
            return value.boolean
        if kind == "none" or kind is None:
            return None
        if kind == "shared_raw":
            buffer = self._buffer(value.shared_raw, source)
            data = bytes(buffer)
            if isinstance(buffer, shm.mmap.mmap):
                buffer.close()  # bytes are a copy: the file is free now (the finalizer releases it)
            return data
        if kind == "big_integer":
            try:
                return int(value.big_integer)
            except ValueError:
                raise CodecError(f"big_integer is not a decimal integer: {value.big_integer[:40]!r}") from None
        raise CodecError(f"unknown Value kind {kind!r}; is the peer running a newer stagevisor?")

    def _buffer(self, shared: pb.SharedBuffer, source: BufferSource | None) -> Any:
        if source is None:
            raise CodecError(f"shared buffer {shared.name[:40]!r} received where it cannot be resolved")
        if shared.inline:
            buffer = source.take_inline(shared.name, shared.size)
            global _inline_taken_bytes
            _inline_taken_bytes += shared.size
            return buffer
        if not _take(shared):
            raise CodecError(
                "unpooled shared buffers are not accepted (receivers never unlink), nor one a decode already took"
            )
        # From here on this buffer is released exactly once: below, or by the mapping's finalizer.
        if self.area is None:
            source.release(shared.name)
            raise CodecError("a shared buffer arrived but this process has no shared-memory area")
        if shared.size == 0:
            source.release(shared.name)
            return b""
        try:
            mapped = self.area.map(shared.name, shared.size)
        except (OSError, ValueError) as error:
            # Its writer keeps the file busy until a Release: without one, a receiver out of
            # descriptors (EMFILE) would pin a file of shared memory per request it fails.
            source.release(shared.name)
            raise CodecError(f"shared buffer refused: {error}") from None
        global _shared_mapped_bytes
        _shared_mapped_bytes += shared.size
        # Released when the mapping is garbage collected, i.e. when the last array on it is gone.
        weakref.finalize(mapped, source.release, shared.name)
        return mapped

    def _decode_tensor(self, tensor: pb.Tensor, source: BufferSource | None) -> Any:
        if tensor.framework == cuda_ipc.FRAMEWORK:
            try:
                rebuilt = cuda_ipc.decode(tensor)
                # Taken: its storage gives the sender's count back when collected, not a drop of the frame.
                tensor.framework = cuda_ipc.TAKEN
                return rebuilt
            except CodecError:
                raise
            except ImportError:
                _import_torch(tensor.dtype)  # raises TorchMissing, naming the extra, where torch is absent
                raise
            except Exception as error:  # noqa: BLE001 - a handle a peer sent that cannot be opened
                raise CodecError(f"CUDA IPC tensor refused: {error}") from None
        framework = tensor.framework
        if framework == cuda_ipc.TAKEN:
            raise CodecError("a CUDA IPC tensor a decode already took cannot be decoded again")
        if framework not in _FRAMEWORKS:
            raise CodecError(f"tensor framework {framework[:40]!r} is not one of {', '.join(_FRAMEWORKS)}")
        dtype, torch_dtype = _tensor_dtype(tensor.dtype)
        shape = tuple(tensor.shape)
        if dtype.hasobject or dtype.itemsize == 0 or (shape and min(shape) < 0):
            raise CodecError(f"tensor of dtype {tensor.dtype[:40]!r} and shape {shape[:8]} cannot be decoded")
        expected = math.prod(shape) * dtype.itemsize
        if tensor.HasField("shared"):
            if tensor.shared.size != expected:
                self._forget(tensor.shared, source)
                raise CodecError(
                    f"tensor of shape {shape[:8]} needs {expected} bytes, the buffer has {tensor.shared.size}"
                )
            buffer: Any = self._buffer(tensor.shared, source)
        else:
            data = tensor.data
            if len(data) != expected:
                raise CodecError(f"tensor of shape {shape[:8]} needs {expected} bytes, {len(data)} came")
            # A writable copy, like the mapped case: executors may edit what they receive.
            buffer = bytearray(data)
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape) if expected else np.empty(shape, dtype)
        if framework == "numpy":
            return array
        if framework == "numpy-scalar":
            return array[()]
        if framework == "torch":
            torch = _import_torch(tensor.dtype)  # only reached when the sender encoded a torch tensor
            result = torch.from_numpy(array)
            if torch_dtype:
                result = result.view(_torch_dtype(torch_dtype))
            return result
        return array

    @staticmethod
    def _forget(shared: pb.SharedBuffer, source: BufferSource | None) -> None:
        if source is not None:
            _discard(shared, source)


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
        _discard(value.shared_raw, source)
    elif kind == "tensor" and value.tensor.framework == cuda_ipc.FRAMEWORK:
        cuda_ipc.discard(value.tensor)
    elif kind == "tensor" and value.tensor.HasField("shared"):
        _discard(value.tensor.shared, source)


def _discard(shared: pb.SharedBuffer, source: BufferSource | None) -> None:
    if source is None:
        return
    if shared.inline:
        source.discard_inline(shared.name)
    elif _take(shared):
        source.release(shared.name)


def _take(shared: pb.SharedBuffer) -> bool:
    """Take a received pooled buffer's one Release on oneself: True the first time, False once taken (or
    never pooled).

    The mark is in the frame's own message (it stops being `pooled`), so whoever holds the frame later,
    decode or a drop of the whole frame, sees which of its buffers are already someone else's to release.
    """
    if not shared.pooled:
        return False
    shared.pooled = False
    return True


def _path(path: Any) -> str:
    """The path of a node for messages: "data", then "[index]" or "[key]" per level ("data['a'][0]")."""
    parts = []
    while isinstance(path, tuple):
        path, key = path
        parts.append(f"[{key!r}]")
    return str(path) + "".join(reversed(parts))


_PACKED_ROOTS = frozenset((dict, list, tuple, np.ndarray))
"""Types of a tree's root that are tried packed."""
_DTYPE_STRS: dict[Any, str] = {}


def _dtype_str(dtype: np.dtype) -> str:
    name = _DTYPE_STRS.get(dtype)
    if name is None:
        name = dtype.str
        if dtype.isbuiltin and len(_DTYPE_STRS) < 256:  # plain dtypes only: equal ones have one string
            _DTYPE_STRS[dtype] = name
    return name


_WIDTHS = {1: "u1", 2: "<i2", 4: "<i4", 8: "<i8"}
_DTYPES: dict[str, tuple[np.dtype, str | None]] = {}
"""Tensor dtype strings already checked: (numpy dtype of the bytes, torch dtype name or None)."""


def _tensor_dtype(name: str) -> tuple[np.dtype, str | None]:
    """The numpy dtype a tensor's bytes are read as, and its torch dtype name; CodecError when unknown."""
    cached = _DTYPES.get(name)
    if cached is not None:
        return cached
    torch_dtype = name if name.startswith("torch.") else None
    try:
        if torch_dtype:
            dtype = np.dtype(_WIDTHS[_torch_dtype(torch_dtype).itemsize])
        else:
            dtype = np.dtype(name)
    except TorchMissing:  # its message says which extra to install
        raise
    except (TypeError, ValueError, KeyError, SyntaxError):
        raise CodecError(f"tensor dtype {name[:40]!r} is not a numpy or torch dtype") from None
    if len(_DTYPES) < 256:  # a peer may send any string: remember only a few
        _DTYPES[name] = (dtype, torch_dtype)
    return dtype, torch_dtype


def _array_dtype(name: str) -> np.dtype:
    """The numpy dtype of a packed array's bytes; CodecError when the string is not a numpy dtype."""
    return _tensor_dtype(name)[0]


def _import_torch(dtype: str) -> Any:
    """The torch module; CodecError naming the extra to install when this process has no torch."""
    try:
        import torch
    except ImportError:
        raise TorchMissing(
            f"a torch tensor ({dtype[:40]}) came, but torch is not installed in this process: "
            f"{install_command('torch')}"
        ) from None
    return torch


def _torch_dtype(name: str) -> Any:
    torch = _import_torch(name)
    dtype = getattr(torch, name.split(".", 1)[1], None)
    if not isinstance(dtype, torch.dtype):
        raise CodecError(f"{name[:40]!r} is not a torch dtype")
    return dtype


def _is_torch_tensor(obj: Any) -> bool:
    # Checked by module name so torch is never imported just to ask.
    module = type(obj).__module__
    return module.startswith("torch") and "torch" in sys.modules and isinstance(obj, sys.modules["torch"].Tensor)
