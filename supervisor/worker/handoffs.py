"""Handoff records for `stagevisor check --verify-edges`: what every stage received along every edge.

With `WorkerSpec.record_handoffs` set (only the check does), a worker wraps
each executor so that what it receives along an edge, as the executor sees
it, is appended to a file in that directory: a `next` edge's data dict, each
stream chunk, and the data that arrives with a stream's end. Values are kept
in a canonical form (`canonical`): the codec's kinds, tensors by dtype, shape,
device and bytes, so that a run with every stage in one process and a run
split across two can be compared field by field (`first_difference`). The
runtime's hot path is untouched: without the setting, nothing is wrapped.

Every run gives its requests new ids: a string that holds the request's id
is compared with the id written as `{request_id}`. The codec's documented
conversions do not count as differences: a tuple arrives as a list,
bytearray and memoryview as bytes, subclasses of int, str, dict as the base
type. Floats compare bit for bit, except that every NaN
equals every NaN (its payload bits carry no meaning).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping, Protocol

import numpy as np

from stagevisor.stages.base import Stage, StageContext, StagePayload, max_text_chars_declared_by, voices_declared_by
from stagevisor.supervisor.dataplane.trace import Trace, items, parse_hop, is_hop_name
from stagevisor.supervisor.numbers import counted

FULL_BYTES = 4 * 1024 * 1024
"""Tensors and bytes up to this size are kept whole; larger ones by a digest per block."""
BLOCK_BYTES = 64 * 1024
REPR_CHARS = 60
"""How much of a value a difference shows, per side."""

NEXT, CHUNK, END = "next", "chunk", "end"
"""What a record holds: a `next` edge's data, one stream chunk, or the data that came with a stream's end."""


# ---- canonical form --------------------------------------------------------------------------------------------

REQUEST_ID = "{request_id}"
"""Stands for the request's id inside a string: every run gives its requests new ids."""


def canonical(value: Any, request_id: str = "") -> Any:
    """A picklable, comparable picture of `value` made of tuples, lists, str, int, float and bytes.

    A string that holds `request_id` holds REQUEST_ID in its stead.

    Nodes: ("none",) ("bool", b) ("int", i) ("float", f) ("str", s) ("bytes", blob)
    ("list", [node...]) ("dict", [(key, node)...]) ("tensor", framework, dtype, shape, device, blob)
    ("object", type name) for what cannot cross a process boundary. A blob is ("raw", bytes) or
    ("blocks", size, block bytes, [digest...]) when over FULL_BYTES.
    """
    if value is None:
        return ("none",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        return ("float", float(value))
    if isinstance(value, str):
        return ("str", str(value).replace(request_id, REQUEST_ID) if request_id else str(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", _blob(bytes(memoryview(value).cast("B")), 1))
    if isinstance(value, np.generic):
        array = np.asarray(value)
        return ("tensor", "numpy-scalar", array.dtype.str, (), "cpu", _array_blob(array))
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return ("object", "numpy array of dtype object")
        return ("tensor", "numpy", value.dtype.str, tuple(value.shape), "cpu", _array_blob(value))
    if _is_torch_tensor(value):
        return _torch(value)
    if isinstance(value, dict):
        return ("dict", [(_key(key, request_id), canonical(item, request_id)) for key, item in value.items()])
    if isinstance(value, (list, tuple)):
        return ("list", [canonical(item, request_id) for item in value])
    return ("object", f"{type(value).__module__}.{type(value).__qualname__}")


def _key(key: Any, request_id: str) -> str:
    if not isinstance(key, str):
        return repr(key)
    return key.replace(request_id, REQUEST_ID) if request_id else key


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "dtype")


def _torch(tensor: Any) -> tuple[Any, ...]:
    import torch  # only reached for a torch tensor

    device = tensor.device.type
    cpu = tensor.detach().cpu().contiguous()
    try:
        array = cpu.numpy()
    except TypeError:  # a dtype numpy lacks (bfloat16, float8): its bits
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[cpu.element_size()]
        array = cpu.view(width).numpy()
    return ("tensor", "torch", str(tensor.dtype), tuple(tensor.shape), device, _array_blob(array))


def _array_blob(array: np.ndarray) -> tuple[Any, ...]:
    array = np.ascontiguousarray(array)
    if array.dtype.kind in "fc" and array.size:
        nan = np.isnan(array)
        if nan.any():
            array = array.copy()
            array[nan] = np.nan  # one bit pattern for every NaN
    return _blob(array.tobytes(), array.dtype.itemsize)


def _blob(data: bytes, itemsize: int) -> tuple[Any, ...]:
    if len(data) <= FULL_BYTES:
        return ("raw", data)
    block = max(itemsize, BLOCK_BYTES // itemsize * itemsize)
    return (
        "blocks",
        len(data),
        block,
        [hashlib.blake2b(data[i : i + block], digest_size=16).digest() for i in range(0, len(data), block)],
    )


# ---- comparison ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """Where two canonical values first differ: a field path and what each side held there."""

    path: str
    together: str
    split: str

    def __str__(self) -> str:
        return f"{self.path}: {self.together} in one process, {self.split} split"


def first_difference(together: Any, split: Any, path: str = "data") -> Difference | None:
    """The first field (depth first, in the order the first value lists them) where the two differ."""
    kind = together[0]
    if kind != split[0]:
        return Difference(path, describe(together), describe(split))
    if kind == "dict":
        theirs = dict(split[1])
        ours = dict(together[1])
        for key, node in together[1]:
            if key not in theirs:
                return Difference(_field(path, key), describe(node), "missing")
            found = first_difference(node, theirs[key], _field(path, key))
            if found:
                return found
        for key, node in split[1]:
            if key not in ours:
                return Difference(_field(path, key), "missing", describe(node))
        return None
    if kind == "list":
        for index, (a, b) in enumerate(zip(together[1], split[1], strict=False)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        if len(together[1]) != len(split[1]):
            return Difference(path, describe(together), describe(split))
        return None
    if kind == "float":
        a, b = together[1], split[1]
        if (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b):
            return None
        return Difference(path, repr(a), repr(b))
    if kind == "tensor":
        return _tensor_difference(together, split, path)
    if kind == "bytes":
        return _blob_difference(together[1], split[1], "u1", None, path)
    if together != split:
        return Difference(path, describe(together), describe(split))
    return None


def _field(path: str, key: str) -> str:
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _tensor_difference(together: tuple[Any, ...], split: tuple[Any, ...], path: str) -> Difference | None:
    _, framework, dtype, shape, device, blob = together
    if together[1:5] != split[1:5]:
        return Difference(path, describe(together), describe(split))
    return _blob_difference(blob, split[5], dtype, shape, path)


def _blob_difference(
    a: tuple[Any, ...], b: tuple[Any, ...], dtype: str, shape: tuple[Any, ...] | None, path: str
) -> Difference | None:
    """The first differing item of two blobs; `shape` None for bytes (indexed by offset)."""
    if a == b:
        return None
    np_dtype = _numpy_dtype(dtype)
    itemsize = np_dtype.itemsize
    size_a = len(a[1]) if a[0] == "raw" else a[1]
    size_b = len(b[1]) if b[0] == "raw" else b[1]
    if size_a != size_b:  # bytes of different lengths (tensors of one shape have one size)
        return Difference(path, counted(size_a // itemsize, "item"), counted(size_b // itemsize, "item"))
    if a[0] == "raw" and b[0] == "raw":
        xa = np.frombuffer(a[1], np.uint8).reshape(-1, itemsize)
        xb = np.frombuffer(b[1], np.uint8).reshape(-1, itemsize)
        index = int(np.argmax((xa != xb).any(axis=1)))
        if shape is None:
            where = f"{path}[{index}]"
        else:
            where = path + "".join(f"[{int(i)}]" for i in np.unravel_index(index, shape))
        va = np.frombuffer(a[1], np_dtype)[index]
        vb = np.frombuffer(b[1], np_dtype)[index]
        return Difference(where, _short(repr(va.item())), _short(repr(vb.item())))
    # Kept by digest: name the first block that differs.
    block = a[2]
    index = next(i for i, (x, y) in enumerate(zip(a[3], b[3], strict=False)) if x != y)
    first, last = index * block // itemsize, min(size_a, (index + 1) * block) // itemsize - 1
    return Difference(
        f"{path} items {first}..{last}",
        "some values",
        f"others (over {FULL_BYTES // 2**20} MiB: compared by block digest, values not kept)",
    )


def _numpy_dtype(dtype: str) -> np.dtype:
    if dtype.startswith("torch."):
        import torch

        size = getattr(torch, dtype.split(".", 1)[1]).itemsize
        return np.dtype({1: "u1", 2: "<i2", 4: "<i4", 8: "<i8"}[size])
    return np.dtype(dtype)


def describe(node: Any) -> str:
    """A bounded picture of a canonical node, for a difference."""
    kind = node[0]
    if kind == "none":
        return "None"
    if kind in ("bool", "int", "float", "str"):
        return _short(repr(node[1]))
    if kind == "bytes":
        blob = node[1]
        return f"bytes[{len(blob[1]) if blob[0] == 'raw' else blob[1]}]"
    if kind == "list":
        return f"list[{len(node[1])}]"
    if kind == "dict":
        return _short("dict with keys " + ", ".join(key for key, _ in node[1]))
    if kind == "tensor":
        _, framework, dtype, shape, device, _blob = node
        name = {"numpy": "ndarray", "numpy-scalar": "numpy scalar", "torch": "tensor"}[framework]
        if not dtype.startswith("torch."):
            readable = np.dtype(dtype).name
            dtype = readable if np.dtype(dtype).isnative or np.dtype(dtype).itemsize == 1 else f"{readable} ({dtype})"
        return f"{name} {dtype} {list(shape)}" + (f" on {device}" if framework == "torch" else "")
    return f"a {node[1]} object"


def _short(text: str) -> str:
    return text if len(text) <= REPR_CHARS else text[: REPR_CHARS - 3] + "..."


# ---- recording in a worker -------------------------------------------------------------------------------------


class HandoffLog:
    """Appends (request id, src, dst, what, canonical value) records to one file per worker process."""

    def __init__(self, directory: str, group: str) -> None:
        self.path = Path(directory) / f"{group}-{os.getpid()}.handoffs"
        self._file = open(self.path, "ab")

    def record(self, request_id: str, src: str, dst: str, what: str, value: Any) -> None:
        record = (request_id, src, dst, what, canonical(value, request_id))
        pickle.dump(record, self._file, protocol=pickle.HIGHEST_PROTOCOL)
        self._file.flush()  # a worker ends with os._exit: nothing may wait in a buffer


def read_handoffs(directory: str | Path) -> Iterator[tuple[str, str, str, str, Any]]:
    """Every record the workers of one run wrote (the check's own private directory), file by file."""
    for path in sorted(Path(directory).glob("*.handoffs")):
        with open(path, "rb") as file:
            while True:
                try:
                    yield pickle.load(file)
                except EOFError:
                    break


class InvocationContext(StageContext, Protocol):
    """The StageContext the worker's runtime passes (dataplane/invocation.py's Invocation), as the recorder reads it."""

    @property
    def trace(self) -> Trace:
        """The request's hops so far: the last one names the stage that handed this invocation its payload."""

    @property
    def inbound(self) -> object | None:
        """The stream this invocation was started by; None when it was called with a final payload."""


def _sender(ctx: InvocationContext, stage: str) -> str | None:
    """The stage that handed this invocation its payload, from the last hop of the request's trace."""
    for item in reversed(items(ctx.trace)):
        name = item[0] if isinstance(item, list) else item
        if isinstance(name, str) and is_hop_name(name):
            src, dst, _ = parse_hop(name)
            return src if dst == stage else None
    return None


class _RecordingContext:
    """The StageContext the executor sees: the runtime's, with each chunk and the end data recorded."""

    __slots__ = ("_ctx", "_log", "_src", "_dst", "_payload")

    def __init__(self, ctx: StageContext, log: HandoffLog, src: str, dst: str, payload: StagePayload) -> None:
        self._ctx, self._log, self._src, self._dst, self._payload = ctx, log, src, dst, payload

    @property
    def request_id(self) -> str:
        return self._ctx.request_id

    @property
    def cancelled(self) -> bool:
        return self._ctx.cancelled

    async def stream(self, chunk: Any) -> None:
        await self._ctx.stream(chunk)

    async def chunks(self) -> AsyncIterator[Any]:
        async for chunk in self._ctx.chunks():
            self._log.record(self._ctx.request_id, self._src, self._dst, CHUNK, chunk)
            yield chunk
        self._log.record(self._ctx.request_id, self._src, self._dst, END, self._payload.data)


class RecordingStage:
    """An executor whose received handoffs are recorded; what the Stage contract lets an executor declare
    (`max_text_chars`, `voices`) is the executor's own."""

    def __init__(self, stage: str, executor: Stage, log: HandoffLog) -> None:
        self._stage = stage
        self._executor = executor
        self._log = log
        # The contract's optional declarations, read as the worker reads them when it reports READY
        # (stages/base.py); the worker wraps its executors just before that.
        self.max_text_chars: object = max_text_chars_declared_by(executor)
        self.voices: object = voices_declared_by(executor)

    async def process(self, payload: StagePayload, ctx: InvocationContext) -> dict[str, Any] | None:
        src = _sender(ctx, self._stage)
        if src is None:  # from the client: not an edge
            return await self._executor.process(payload, ctx)
        if ctx.inbound is not None:  # started by a stream (invocation.Invocation)
            return await self._executor.process(payload, _RecordingContext(ctx, self._log, src, self._stage, payload))
        self._log.record(ctx.request_id, src, self._stage, NEXT, payload.data)
        return await self._executor.process(payload, ctx)


def record_handoffs(directory: str, group: str, executors: Mapping[str, Any]) -> dict[str, Any]:
    """`executors`, each wrapped to record in `directory` what it receives along an edge."""
    log = HandoffLog(directory, group)
    return {name: RecordingStage(name, executor, log) for name, executor in executors.items()}
