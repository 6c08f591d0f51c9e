"""Packed values: the compact layout of small, common data trees (the bytes of `Value.packed`).

A stream chunk is usually a small dict of a few scalars and a numpy array. As
a `Value` tree it costs a protobuf message per node to build on one side and
to walk on the other, which is most of the Python work of a small handoff.
Packed, the whole tree is one bytes field: a tag byte per node, then its
content, little-endian, with arrays as a short header and their raw bytes.

    N T F                      None, True, False
    i <q>                      int in the signed 64-bit range
    f <d>                      float
    s <I len> utf-8            str
    b <I len> bytes            bytes and bytearray (arrive as bytes)
    l <I count> items          list and tuple (arrive as lists)
    d <I count> (<I len> utf-8 key, item)*   dict with str keys, insertion order
    a <B len> dtype <B ndim> <q>*ndim raw    C-ordered numpy array ("<f4"-style dtype string)
    g (as a)                   numpy scalar (ndim 0, arrives as a numpy scalar)

`pack` covers exactly these node types (exact types, no subclasses), numeric
and bool dtypes, buffers under the codec's shared-memory threshold and trees
at most MAX_DEPTH deep; it raises `Unpackable` for anything else and the codec
falls back to the Value tree, so what arrives is the same either way.
`unpack` checks every length, tag, dtype and shape against what arrived;
anything off is a CodecError for the frame's request only.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable

import numpy as np

MAX_DEPTH = 64
"""Deepest nesting packed (a deeper tree goes as a Value tree) or accepted."""

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_pack_u32, _pack_i64, _pack_f64 = _U32.pack, _I64.pack, _F64.pack
_unpack_u32, _unpack_i64, _unpack_f64 = _U32.unpack_from, _I64.unpack_from, _F64.unpack_from
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_NUMERIC = frozenset("biufc")
"""dtype kinds packed: bool, signed and unsigned ints, floats, complex."""
_SHAPES = [struct.Struct(f"<{n}q") for n in range(33)]

_NONE, _TRUE, _FALSE, _INT, _FLOAT, _STR, _BYTES, _LIST, _DICT, _ARRAY, _SCALAR = (
    ord(c) for c in "NTFifsbldag")


class Unpackable(Exception):
    """The tree holds a node the packed layout does not cover; encode it as a Value tree."""


class PackError(ValueError):
    """Packed bytes that do not decode; the codec turns it into a CodecError."""


_array_headers: dict[tuple, bytes] = {}
"""(tag, dtype, shape) -> the header bytes of an array node; a few hundred at most."""


def pack(obj: Any, limit: int) -> bytes:
    """The packed bytes of `obj`; Unpackable when a node is not covered or a buffer reaches `limit` bytes."""
    parts: list[Any] = []
    _pack(obj, parts, limit, 0)
    return b"".join(parts)


def _pack(obj: Any, parts: list, limit: int, depth: int) -> None:
    kind = obj.__class__
    append = parts.append
    if kind is dict:
        if depth >= MAX_DEPTH:
            raise Unpackable("too deep")
        append(b"d" + _pack_u32(len(obj)))
        for key, item in obj.items():
            if key.__class__ is not str:
                raise Unpackable("a key that is not a str")
            key = key.encode()
            append(_pack_u32(len(key)))
            append(key)
            # The common leaves inline; containers and the rest recurse.
            kind = item.__class__
            if kind is np.ndarray:
                _pack_array(item, parts, limit, b"a")
            elif kind is int:
                if not _INT64_MIN <= item <= _INT64_MAX:
                    raise Unpackable("an int outside 64 bits")
                append(b"i" + _pack_i64(item))
            elif kind is float:
                append(b"f" + _pack_f64(item))
            elif kind is str:
                item = item.encode()
                append(b"s" + _pack_u32(len(item)))
                append(item)
            else:
                _pack(item, parts, limit, depth + 1)
    elif kind is np.ndarray:
        _pack_array(obj, parts, limit, b"a")
    elif kind is int:
        if not _INT64_MIN <= obj <= _INT64_MAX:
            raise Unpackable("an int outside 64 bits")
        append(b"i" + _pack_i64(obj))
    elif kind is float:
        append(b"f" + _pack_f64(obj))
    elif kind is str:
        obj = obj.encode()
        append(b"s" + _pack_u32(len(obj)))
        append(obj)
    elif kind is bool:
        append(b"T" if obj else b"F")
    elif obj is None:
        append(b"N")
    elif kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            raise Unpackable("too deep")
        append(b"l" + _pack_u32(len(obj)))
        for item in obj:
            _pack(item, parts, limit, depth + 1)
    elif kind is bytes or kind is bytearray:
        if len(obj) >= limit:
            raise Unpackable("a large buffer")
        append(b"b" + _pack_u32(len(obj)))
        append(obj)
    elif isinstance(obj, np.generic) and kind.__module__ == "numpy":
        _pack_array(np.asarray(obj), parts, limit, b"g")
    else:
        raise Unpackable(kind.__qualname__)


def _pack_array(array: np.ndarray, parts: list, limit: int, tag: bytes) -> None:
    dtype = array.dtype
    if dtype.kind not in _NUMERIC or not dtype.isbuiltin or array.nbytes >= limit or array.ndim > 32:
        raise Unpackable("an array the packed layout does not cover")
    key = (tag, dtype, array.shape)
    header = _array_headers.get(key)
    if header is None:
        name = dtype.str.encode()
        header = tag + bytes((len(name),)) + name + bytes((array.ndim,)) + _SHAPES[array.ndim].pack(*array.shape)
        if len(_array_headers) < 512:
            _array_headers[key] = header
    parts.append(header)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    parts.append(memoryview(array).cast("B") if array.ndim and array.size else array.tobytes())


def unpack(data: bytes, array_dtype: Callable[[str], np.dtype]) -> Any:
    """The tree packed in `data`; PackError when it is malformed.

    `array_dtype` maps a dtype string to the numpy dtype its bytes are read
    as, raising for strings it refuses (the codec's checked, cached lookup).
    """
    try:
        obj, position = _unpack(data, 0, 0, array_dtype)
    except PackError:
        raise
    except (struct.error, IndexError):
        raise PackError("packed value cut short") from None
    except UnicodeDecodeError:
        raise PackError("packed value with a string that is not UTF-8") from None
    if position != len(data):
        raise PackError(f"packed value with {len(data) - position} bytes after its end")
    return obj


def _unpack(data: bytes, position: int, depth: int, array_dtype: Callable[[str], np.dtype]) -> tuple[Any, int]:
    tag = data[position]
    position += 1
    if tag == _DICT:
        if depth >= MAX_DEPTH:
            raise PackError(f"packed value nested deeper than {MAX_DEPTH}")
        (count,) = _unpack_u32(data, position)
        position += 4
        if count > len(data) - position:
            raise PackError(f"packed dict of {count} items in {len(data) - position} bytes")
        out = {}
        for _ in range(count):
            (size,) = _unpack_u32(data, position)
            position += 4
            end = position + size
            if end > len(data):
                raise PackError("packed key cut short")
            key = data[position:end].decode()
            # The common leaves inline; the rest recurse.
            tag = data[end]
            if tag == _INT:
                (out[key],) = _unpack_i64(data, end + 1)
                position = end + 9
            elif tag == _FLOAT:
                (out[key],) = _unpack_f64(data, end + 1)
                position = end + 9
            elif tag == _ARRAY:
                out[key], position = _unpack_array(data, end + 1, tag, array_dtype)
            else:
                out[key], position = _unpack(data, end, depth + 1, array_dtype)
        return out, position
    if tag == _ARRAY or tag == _SCALAR:
        return _unpack_array(data, position, tag, array_dtype)
    if tag == _INT:
        return _unpack_i64(data, position)[0], position + 8
    if tag == _FLOAT:
        return _unpack_f64(data, position)[0], position + 8
    if tag == _STR or tag == _BYTES:
        (size,) = _unpack_u32(data, position)
        position += 4
        end = position + size
        if end > len(data):
            raise PackError("packed string or bytes cut short")
        chunk = data[position:end]
        return (chunk.decode() if tag == _STR else bytes(chunk)), end
    if tag == _NONE:
        return None, position
    if tag == _TRUE:
        return True, position
    if tag == _FALSE:
        return False, position
    if tag == _LIST:
        if depth >= MAX_DEPTH:
            raise PackError(f"packed value nested deeper than {MAX_DEPTH}")
        (count,) = _unpack_u32(data, position)
        position += 4
        if count > len(data) - position:
            raise PackError(f"packed list of {count} items in {len(data) - position} bytes")
        items = []
        append = items.append
        for _ in range(count):
            item, position = _unpack(data, position, depth + 1, array_dtype)
            append(item)
        return items, position
    raise PackError(f"unknown packed tag {tag}")


_headers_seen: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}
"""Array headers already checked (dtype string through shape) -> (dtype, shape, byte count); a few hundred."""


def _unpack_array(data: bytes, position: int, tag: int, array_dtype: Callable[[str], np.dtype]) -> tuple[Any, int]:
    size = data[position]
    ndim = data[position + 1 + size]
    header_end = position + 2 + size + 8 * ndim
    if header_end > len(data):
        raise PackError("packed array header cut short")
    header = data[position - 1:header_end]  # with the tag: a scalar's header is not an array's
    known = _headers_seen.get(header)
    if known is None:
        known = _check_header(data, position, size, ndim, tag, array_dtype)
        if len(_headers_seen) < 512:  # a peer may send any header: remember only a few
            _headers_seen[header] = known
    dtype, shape, nbytes = known
    end = header_end + nbytes
    if end > len(data):
        raise PackError(f"packed array of shape {shape[:8]} needs {nbytes} bytes, {len(data) - header_end} came")
    if nbytes:
        # A writable copy, as from a Value tree: executors may edit what they receive.
        if nbytes < 65536:
            buffer = bytearray(data[header_end:end])
        else:
            with memoryview(data) as view:
                buffer = bytearray(view[header_end:end])
        array = np.frombuffer(buffer, dtype=dtype)
        if len(shape) != 1:  # a 1-D array (the usual audio chunk) already has its shape
            array = array.reshape(shape)
    else:
        array = np.empty(shape, dtype)
    return (array[()] if tag == _SCALAR else array), end


def _check_header(data: bytes, position: int, size: int, ndim: int, tag: int,
                  array_dtype: Callable[[str], np.dtype]) -> tuple[np.dtype, tuple[int, ...], int]:
    name = data[position + 1:position + 1 + size].decode()
    if name.startswith("torch."):
        raise PackError(f"packed array of dtype {name[:40]!r}")
    dtype = array_dtype(name)
    if ndim > 32 or (tag == _SCALAR and ndim):
        raise PackError(f"packed array of {ndim} dimensions")
    shape = _SHAPES[ndim].unpack_from(data, position + 2 + size)
    if dtype.hasobject or dtype.itemsize == 0 or (shape and min(shape) < 0):
        raise PackError(f"packed array of dtype {name[:40]!r} and shape {shape[:8]} cannot be decoded")
    return dtype, shape, math.prod(shape) * dtype.itemsize
