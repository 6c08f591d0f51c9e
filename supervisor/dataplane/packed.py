"""Packed values: small, common data trees as one msgpack document (the bytes of `Value.packed`).

A stream chunk is usually a small dict of a few scalars and a numpy array. As
a `Value` tree it costs a protobuf message per node to build on one side and
to walk on the other, which is most of the Python work of a small handoff.
Packed, the whole tree is one bytes field written and read by msgpack's C
extension (str and bytes kept apart as str and bin). numpy arrays and numpy
scalars are msgpack extension types, little-endian:

    ext 1  <B len> dtype <B ndim> <q>*ndim raw    C-ordered numpy array ("<f4"-style dtype string)
    ext 2  (as ext 1, ndim 0)                     numpy scalar (arrives as a numpy scalar)

`pack` covers exactly None, bool, int (signed or unsigned 64-bit), float, str,
bytes, bytearray (arrives as bytes), list, tuple (arrives as a list), dicts
with str keys (insertion order) and those numpy nodes: exact types, no
subclasses, numeric and bool dtypes in native byte order, buffers under the
codec's shared-memory threshold and trees at most MAX_DEPTH deep. It raises
`Unpackable` for anything else and the codec falls back to the Value tree, so
what arrives is the same either way. `unpack` bounds every length by the bytes
that arrived and checks every dtype, shape and the depth; anything off is a
PackError, which the codec turns into a CodecError for the frame's request only.
"""

from __future__ import annotations

import math
import struct
import threading
from typing import Any, Callable

import msgpack
import numpy as np

MAX_DEPTH = 64
"""Deepest nesting packed (a deeper tree goes as a Value tree) or accepted."""

_ARRAY, _SCALAR = 1, 2
"""msgpack extension type codes."""
_NUMERIC = frozenset("biufc")
"""dtype kinds packed: bool, signed and unsigned ints, floats, complex."""
_SHAPES = [struct.Struct(f"<{n}q") for n in range(33)]
_CONTAINERS = frozenset((dict, list, tuple))
_LEAVES = frozenset((type(None), bool, int, float, str, np.ndarray))
"""Node types msgpack may write unchecked (it checks ints itself; the packer's `default` checks numpy nodes)."""
_BUFFERS = frozenset((bytes, bytearray))
_STR = frozenset((str,))
_ext = msgpack.ExtType._make
"""An ExtType without re-checking what `_pack_array` guarantees (namedtuple's own constructor)."""


class Unpackable(Exception):
    """The tree holds a node the packed layout does not cover; encode it as a Value tree."""


class PackError(ValueError):
    """Packed bytes that do not decode; the codec turns it into a CodecError."""


# ---- packing ------------------------------------------------------------------

_local = threading.local()
"""Per thread: {limit: msgpack.Packer} (a Packer holds a buffer and is not shared across threads)."""
_array_headers: dict[tuple, bytes] = {}
"""(dtype number, shape) -> the header bytes of an array; a few hundred at most."""


def pack(obj: Any, limit: int) -> bytes:
    """The packed bytes of `obj`; Unpackable when a node is not covered or a buffer reaches `limit` bytes."""
    kind = obj.__class__
    if kind in _CONTAINERS:
        _check(obj, limit, 0)
    elif kind is not np.ndarray:
        raise Unpackable(kind.__qualname__)
    try:
        packer = _local.packers[limit]
    except AttributeError:
        _local.packers = {}
        packer = _local.packers[limit] = _packer(limit)
    except KeyError:
        packer = _local.packers[limit] = _packer(limit)
    return packer.pack(obj)


def _packer(limit: int) -> msgpack.Packer:
    def default(obj: Any) -> Any:
        """What msgpack hands back under strict_types: tuples, numpy nodes, ints beyond 64 bits, subclasses."""
        kind = obj.__class__
        if kind is np.ndarray:
            return _pack_array(obj, limit, _ARRAY)
        if kind is tuple:
            return list(obj)
        if isinstance(obj, np.generic) and kind.__module__ == "numpy":
            return _pack_array(np.asarray(obj), limit, _SCALAR)
        raise Unpackable("an int outside 64 bits" if kind is int else kind.__qualname__)

    return msgpack.Packer(use_bin_type=True, strict_types=True, default=default)


def _check(obj: Any, limit: int, depth: int) -> None:
    """What msgpack would write but the layout refuses: too deep, keys that are not str, large or foreign buffers."""
    if depth >= MAX_DEPTH:
        raise Unpackable("too deep")
    if obj.__class__ is dict:
        if not _STR.issuperset(map(type, obj)):
            raise Unpackable("a key that is not a str")
        obj = obj.values()
    if _LEAVES.issuperset(map(type, obj)):  # one C-speed pass; the usual chunk has only plain leaves
        return
    for item in obj:
        kind = item.__class__
        if kind in _CONTAINERS:
            _check(item, limit, depth + 1)
        elif kind in _BUFFERS:
            if len(item) >= limit:
                raise Unpackable("a large buffer")
        elif kind not in _LEAVES and not (isinstance(item, np.generic) and kind.__module__ == "numpy"):
            raise Unpackable(kind.__qualname__)


def _pack_array(array: np.ndarray, limit: int, code: int) -> msgpack.ExtType:
    dtype = array.dtype
    if dtype.kind not in _NUMERIC or not dtype.isbuiltin or array.nbytes >= limit or array.ndim > 32:
        raise Unpackable("an array the packed layout does not cover")
    key = (dtype.num, array.shape)  # num names a builtin dtype in native byte order
    header = _array_headers.get(key)
    if header is None:
        name = dtype.str.encode()
        header = bytes((len(name),)) + name + bytes((array.ndim,)) + _SHAPES[array.ndim].pack(*array.shape)
        if len(_array_headers) < 512:
            _array_headers[key] = header
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.nbytes < 65536:  # two small copies cost less than a memoryview
        return _ext((code, header + array.tobytes()))
    return _ext((code, b"".join((header, array.data.cast("B")))))


# ---- unpacking ----------------------------------------------------------------


def unpack(data: bytes, array_dtype: Callable[[str], np.dtype]) -> Any:
    """The tree packed in `data`; PackError when it is malformed.

    `array_dtype` maps a dtype string to the numpy dtype its bytes are read
    as, raising for strings it refuses (the codec's checked, cached lookup).
    """
    hook = _ext_hooks.get(array_dtype)
    if hook is None:
        hook = _ext_hooks[array_dtype] = _ext_hook(array_dtype)
    size = len(data)
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=hook,
            use_list=True,
            max_str_len=size,
            max_bin_len=size,
            max_ext_len=size,
            max_array_len=size,
            max_map_len=size // 2,
        )
    except PackError:
        raise
    except msgpack.ExtraData as error:
        raise PackError(f"packed value with {len(error.extra)} bytes after its end") from None
    except msgpack.StackError:
        raise PackError(f"packed value nested deeper than {MAX_DEPTH}") from None
    except msgpack.FormatError:
        raise PackError("packed value with a byte that starts no msgpack value") from None
    except UnicodeDecodeError:
        raise PackError("packed value with a string that is not UTF-8") from None
    except msgpack.OutOfData:
        raise PackError("packed value cut short") from None
    except ValueError as error:  # a length beyond what arrived, a key that is not a str, incomplete input
        message = str(error)
        if message.startswith("Unpack failed: incomplete input"):
            message = "cut short"
        raise PackError(f"packed value: {message[:200]}") from None
    if obj.__class__ in _CONTAINERS and _too_deep(obj, 0):
        raise PackError(f"packed value nested deeper than {MAX_DEPTH}")
    return obj


def _too_deep(obj: Any, depth: int) -> bool:
    if depth >= MAX_DEPTH:
        return True
    if obj.__class__ is dict:
        obj = obj.values()
    if _CONTAINERS.isdisjoint(map(type, obj)):
        return False
    return any(item.__class__ in _CONTAINERS and _too_deep(item, depth + 1) for item in obj)


_ext_hooks: dict[Callable, Callable] = {}
_headers_seen: tuple[dict, dict, dict] = ({}, {}, {})
"""Per extension code, array headers already checked (dtype string through shape) -> (dtype, shape, byte count)."""


def _ext_hook(array_dtype: Callable[[str], np.dtype]) -> Callable[[int, bytes], Any]:
    def hook(code: int, data: bytes) -> Any:
        if code != _ARRAY and code != _SCALAR:
            raise PackError(f"packed value with unknown extension type {code}")
        try:
            size = data[0]
            ndim = data[1 + size]
        except IndexError:
            raise PackError("packed array header cut short") from None
        header_end = 2 + size + 8 * ndim
        if header_end > len(data):
            raise PackError("packed array header cut short")
        header = data[:header_end]
        seen = _headers_seen[code]
        known = seen.get(header)
        if known is None:
            known = _check_header(data, size, ndim, code, array_dtype)
            if len(seen) < 256:  # a peer may send any header: remember only a few
                seen[header] = known
        dtype, shape, nbytes = known
        if len(data) - header_end != nbytes:
            raise PackError(f"packed array of shape {shape[:8]} needs {nbytes} bytes, {len(data) - header_end} came")
        if nbytes:
            # A writable copy, as from a Value tree: executors may edit what they receive.
            # A fresh, aligned buffer, copied once (slicing `data` itself would copy twice).
            array = np.frombuffer(bytearray(memoryview(data)[header_end:]), dtype)
            if len(shape) != 1:  # a 1-D array (the usual audio chunk) already has its shape
                array = array.reshape(shape)
        else:
            array = np.empty(shape, dtype)
        return array[()] if code == _SCALAR else array

    return hook


def _check_header(
    data: bytes, size: int, ndim: int, code: int, array_dtype: Callable[[str], np.dtype]
) -> tuple[np.dtype, tuple[int, ...], int]:
    try:
        name = data[1 : 1 + size].decode()
    except UnicodeDecodeError:
        raise PackError("packed array with a dtype that is not UTF-8") from None
    if name.startswith("torch."):
        raise PackError(f"packed array of dtype {name[:40]!r}")
    dtype = array_dtype(name)
    if ndim > 32 or (code == _SCALAR and ndim):
        raise PackError(f"packed array of {ndim} dimensions")
    shape = _SHAPES[ndim].unpack_from(data, 2 + size)
    if dtype.hasobject or dtype.itemsize == 0 or (shape and min(shape) < 0):
        raise PackError(f"packed array of dtype {name[:40]!r} and shape {shape[:8]} cannot be decoded")
    return dtype, shape, math.prod(shape) * dtype.itemsize
