"""The data tree of a StagePayload <-> the `stagevisor.v1.Value` proto, for cross-process edges.

Supported: None, bool, int, float, str, bytes (bytearray/memoryview arrive as
bytes), list and tuple (arrive as list), dict with str keys (insertion order
kept), numpy arrays and scalars, and torch tensors where torch is importable.
Tensors keep dtype and shape. torch is imported only when a torch tensor is
actually encoded or decoded.

Buffers of at least `shm_threshold` bytes do not go inline: they are written
once into /dev/shm (see shm.py) so no gRPC message size limit applies and the
receiver maps them instead of parsing them.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import numpy as np

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import cuda_ipc, shm

DEFAULT_SHM_THRESHOLD = 256 * 1024
"""Bytes at which a tensor or bytes value moves to shared memory instead of the message."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class CodecError(TypeError):
    """A value in `data` cannot cross a process boundary; the message says where and what."""


class Codec:
    """Encodes and decodes data trees; one per worker (it owns the shared-memory name prefix)."""

    def __init__(self, shm_prefix: str | None = None, shm_threshold: int = DEFAULT_SHM_THRESHOLD,
                 pooled: bool = False, cuda: cuda_ipc.CudaIpc | None = None) -> None:
        self.shm_prefix = shm_prefix if shm_prefix and shm.available() else None
        self.shm_threshold = shm_threshold
        self.pool = shm.SegmentPool(self.shm_prefix) if pooled and self.shm_prefix else None
        """Reusable shared buffers; only for senders that get Release frames back (see SegmentPool)."""
        self._wrote_shared = False
        self.cuda = cuda
        """CUDA IPC policy: CUDA tensors for a worker on the same GPU go by handle (see cuda_ipc.py)."""
        self._peer: str | None = None
        self._encoders: dict[type, Callable[[Any, pb.Value, str], None]] = {
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
        self._encode_into(obj, value, "data")
        return value

    def encode_into(self, obj: Any, value: pb.Value, peer: str | None = None) -> None:
        """Encode `obj` into an existing (sub)message, avoiding a copy of the tree; `peer` is the destination."""
        self._peer = peer
        try:
            self._encode_into(obj, value, "data")
        finally:
            self._peer = None

    def _encode_into(self, obj: Any, value: pb.Value, path: str) -> None:
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
                f"{path}: {type(obj).__qualname__} cannot cross a process boundary; use None, bool, "
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
        if self.shm_prefix is not None and len(obj) >= self.shm_threshold:
            self._share(memoryview(obj).cast("B"), value.shared_raw)
        else:
            value.raw = bytes(obj)

    def _list(self, obj: Any, value: pb.Value, path: str) -> None:
        items = value.list.items
        for index, item in enumerate(obj):
            self._encode_into(item, items.add(), f"{path}[{index}]")
        if not obj:
            value.list.SetInParent()

    def _dict(self, obj: dict, value: pb.Value, path: str) -> None:
        mapping = value.map
        mapping.SetInParent()
        for key, item in obj.items():
            if not isinstance(key, str):
                raise CodecError(f"{path}: key {key!r} is a {type(key).__qualname__}; only str keys cross processes")
            mapping.keys.append(key)
            self._encode_into(item, mapping.values.add(), f"{path}[{key!r}]")

    def _ndarray(self, obj: np.ndarray, value: pb.Value, path: str) -> None:
        if obj.dtype.hasobject:
            raise CodecError(f"{path}: numpy arrays of dtype object cannot cross a process boundary")
        self._tensor(obj, value, "numpy")

    def _tensor(self, array: np.ndarray, value: pb.Value, framework: str, dtype: str | None = None) -> None:
        tensor = value.tensor
        tensor.framework = framework
        tensor.dtype = dtype or array.dtype.str
        tensor.shape.extend(array.shape)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        if self.shm_prefix is not None and array.nbytes >= self.shm_threshold:
            self._share(memoryview(array.reshape(-1)).cast("B"), tensor.shared)
        else:
            tensor.data = array.tobytes()

    def wrote_shared(self) -> bool:
        """True when something went to shared memory since the last call.

        A sender then yields to its event loop once, so the link's reader can
        take in Release frames and the pool reuses buffers instead of growing.
        """
        wrote, self._wrote_shared = self._wrote_shared, False
        return wrote

    def _share(self, view: memoryview, shared: pb.SharedBuffer) -> None:
        self._wrote_shared = True
        if self.pool is not None:
            shared.name = self.pool.write(view)
            shared.pooled = True
        else:
            shared.name = shm.write(self.shm_prefix, view)
        shared.size = view.nbytes

    def release(self, names: Any) -> None:
        """The receiver is done with these pooled buffers (a Release frame arrived)."""
        if self.pool is not None:
            for name in names:
                self.pool.release(name)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _torch(self, obj: Any, value: pb.Value) -> None:
        import torch  # only reached when a torch tensor is being encoded

        if obj.is_cuda and self.cuda is not None and self.cuda.shares_with(self._peer):
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

    def decode(self, value: pb.Value, release: Callable[[str], None] | None = None) -> Any:
        """The Python object a Value stands for.

        Unpooled shared buffers are mapped and unlinked. A pooled buffer is
        mapped and `release(name)` is called once nothing uses it any more, so
        `release` must be given for pooled data and be safe from any thread
        (the last array may die in an executor's worker thread).
        """
        kind = value.WhichOneof("kind")
        if kind == "map":
            mapping = value.map
            return {key: self.decode(item, release) for key, item in zip(mapping.keys, mapping.values)}
        if kind == "text":
            return value.text
        if kind == "integer":
            return value.integer
        if kind == "real":
            return value.real
        if kind == "tensor":
            return _decode_tensor(value.tensor, release)
        if kind == "list":
            return [self.decode(item, release) for item in value.list.items]
        if kind == "raw":
            return value.raw
        if kind == "boolean":
            return value.boolean
        if kind == "none" or kind is None:
            return None
        if kind == "shared_raw":
            shared = value.shared_raw
            mapped = _map(shared, release)
            data = bytes(mapped)
            if not isinstance(mapped, bytes):
                mapped.close()  # bytes are a copy: the buffer is free now (the finalizer releases it)
            return data
        if kind == "big_integer":
            return int(value.big_integer)
        raise CodecError(f"unknown Value kind {kind!r}; is the peer running a newer stagevisor?")


def discard_shared(value: pb.Value, release: Callable[[str], None] | None = None) -> None:
    """Free every shared buffer referenced in a Value that will never be decoded.

    Unpooled buffers are unlinked; pooled ones are handed back with `release`.
    """
    kind = value.WhichOneof("kind")
    if kind == "map":
        for item in value.map.values:
            discard_shared(item, release)
    elif kind == "list":
        for item in value.list.items:
            discard_shared(item, release)
    elif kind == "shared_raw":
        _discard(value.shared_raw, release)
    elif kind == "tensor" and value.tensor.framework == cuda_ipc.FRAMEWORK:
        cuda_ipc.discard(value.tensor)
    elif kind == "tensor" and value.tensor.HasField("shared"):
        _discard(value.tensor.shared, release)


def _discard(shared: pb.SharedBuffer, release: Callable[[str], None] | None) -> None:
    if shared.pooled:
        if release is not None:
            release(shared.name)
    else:
        shm.discard(shared.name)


def _map(shared: pb.SharedBuffer, release: Callable[[str], None] | None) -> Any:
    if not shared.pooled:
        return shm.take(shared.name, shared.size)
    if release is None:
        raise CodecError(f"pooled shared buffer {shared.name} received where it cannot be released")
    if shared.size == 0:
        release(shared.name)
        return b""
    mapped = shm.map_pooled(shared.name, shared.size)
    # Released when the mapping is garbage collected, i.e. when the last array on it is gone.
    weakref.finalize(mapped, release, shared.name)
    return mapped


def _decode_tensor(tensor: pb.Tensor, release: Callable[[str], None] | None) -> Any:
    if tensor.framework == cuda_ipc.FRAMEWORK:
        return cuda_ipc.decode(tensor)
    torch_dtype = tensor.dtype if tensor.dtype.startswith("torch.") else None
    if torch_dtype:
        width = {"int8": "u1", "int16": "<i2", "int32": "<i4", "int64": "<i8"}
        dtype = np.dtype(width[_torch_int_view(torch_dtype)])
    else:
        dtype = np.dtype(tensor.dtype)
    shape = tuple(tensor.shape)
    if tensor.HasField("shared"):
        buffer: Any = _map(tensor.shared, release)
    else:
        # A writable copy, like the mapped case: executors may edit what they receive.
        buffer = bytearray(tensor.data)
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape) if len(buffer) else np.empty(shape, dtype)
    if tensor.framework == "numpy-scalar":
        return array[()]
    if tensor.framework == "torch":
        import torch  # only reached when the sender encoded a torch tensor

        result = torch.from_numpy(array)
        if torch_dtype:
            result = result.view(getattr(torch, torch_dtype.split(".", 1)[1]))
        return result
    return array


def _torch_int_view(torch_dtype: str) -> str:
    import torch

    size = getattr(torch, torch_dtype.split(".", 1)[1]).itemsize
    return {1: "int8", 2: "int16", 4: "int32", 8: "int64"}[size]


def _is_torch_tensor(obj: Any) -> bool:
    # Checked by module name so torch is never imported just to ask.
    module = type(obj).__module__
    return module.startswith("torch") and "torch" in sys.modules and isinstance(obj, sys.modules["torch"].Tensor)
