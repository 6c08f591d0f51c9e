"""Decoding: the Value a peer sent -> the Python object it stands for, checked instead of trusted.

dtype, shape and byte counts must agree, and shared buffers are opened only as shm.py allows; anything else is
a CodecError that fails only the request the frame carried. Each pooled buffer decode reaches is released to
its sender exactly once (see `Decoder.decode`). `codec.Codec` is a Decoder that also encodes.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import cuda_ipc, shm
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.dtypes import array_dtype, import_torch, tensor_dtype, torch_dtype_of
from stagevisor.supervisor.dataplane.out_of_line import BufferSource, discard, take
from stagevisor.supervisor.dataplane.packed import PackError, unpack

_FRAMEWORKS = ("numpy", "numpy-scalar", "torch")
_shared_mapped_bytes = 0
_inline_taken_bytes = 0


def shared_bytes_received() -> int:
    """Bytes this process has mapped from shared buffers so far (a running total, for metrics)."""
    return _shared_mapped_bytes


def inline_bytes_received() -> int:
    """Bytes of large buffers this process has taken from inline pieces so far (a running total, for metrics)."""
    return _inline_taken_bytes


class Decoder:
    """Decodes the Values peers send; pooled buffers are mapped from this process's shared-memory `area`."""

    def __init__(self, area: shm.SharedArea | None = None) -> None:
        self.area = area
        """Where pooled buffers are mapped from (and, for a Codec, written to); None: no shared memory here."""

    def decode(self, value: pb.Value, source: BufferSource | None = None) -> Any:
        """The Python object a Value stands for; CodecError when the Value is malformed.

        A pooled buffer is mapped from this process's area and released to
        `source` once nothing uses it any more (from whatever thread drops the
        last array). An inline buffer is taken from `source`'s assembled pieces.

        Each pooled buffer decode reaches is marked taken in `value` itself
        (see `out_of_line.take`), whether decode returns or raises: it is released exactly
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
                return unpack(value.packed, array_dtype)
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
        if not take(shared):
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
                import_torch(tensor.dtype)  # raises TorchMissing, naming the extra, where torch is absent
                raise
            except Exception as error:  # noqa: BLE001 - a handle a peer sent that cannot be opened
                raise CodecError(f"CUDA IPC tensor refused: {error}") from None
        framework = tensor.framework
        if framework == cuda_ipc.TAKEN:
            raise CodecError("a CUDA IPC tensor a decode already took cannot be decoded again")
        if framework not in _FRAMEWORKS:
            raise CodecError(f"tensor framework {framework[:40]!r} is not one of {', '.join(_FRAMEWORKS)}")
        dtype, torch_dtype = tensor_dtype(tensor.dtype)
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
            torch = import_torch(tensor.dtype)  # only reached when the sender encoded a torch tensor
            result = torch.from_numpy(array)
            if torch_dtype:
                result = result.view(torch_dtype_of(torch_dtype))
            return result
        return array

    @staticmethod
    def _forget(shared: pb.SharedBuffer, source: BufferSource | None) -> None:
        if source is not None:
            discard(shared, source)
