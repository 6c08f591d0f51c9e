"""CUDA tensors across processes on one GPU: a CUDA IPC handle travels, the data stays on the device.

The codec (codec.py) asks `CudaIpc.shares_with(address)` before encoding a
CUDA tensor for a destination. Only when the worker at that address runs on
the same physical GPU (the same placement GPU id: every worker of a daemon
counts devices the same way) does the tensor go by handle; otherwise, and
whenever sharing fails, the codec copies it to host memory as before.

Lifetimes are torch's CUDA IPC reference counting (the same machinery as
torch.multiprocessing): sharing a storage registers a counter in a small
shared file; the receiver's storage holds one count until it is garbage
collected. A sender that drops its tensor meanwhile parks the block in
torch's "limbo" instead of freeing it, so the receiver never reads freed
memory; `torch.cuda.ipc_collect()` frees parked blocks whose count is back to
zero. A collector thread calls it every COLLECT_INTERVAL seconds once this
worker has shared anything, so the sender's memory returns to its baseline
shortly after the receiver lets go. A frame dropped before it was decoded
gives its count back through `discard` (codec.discard_shared).

torch is imported only when a CUDA tensor is encoded or an IPC tensor decoded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Mapping

from stagevisor.supervisor import envs

log = logging.getLogger(__name__)

FRAMEWORK = "torch-cuda-ipc"
"""`Tensor.framework` of a tensor sent by handle; `data` holds the handle record (JSON)."""
TAKEN = "torch-cuda-ipc-taken"
"""What the codec sets `Tensor.framework` to once a handle is decoded: the rebuilt tensor's storage gives the
sender's reference count back when collected, so a later drop of the frame must not give it back again."""
COLLECT_INTERVAL = 0.5

_BYTES_FIELDS = ("handle", "ref_counter_handle", "event_handle")


class CudaIpc:
    """The CUDA IPC policy of one worker: which destinations share its GPU, and the encoding itself."""

    def __init__(self, local_gpu: int | None, address_gpus: Mapping[str, int | None], enabled: bool = True) -> None:
        self.local_gpu = local_gpu
        self.same_gpu = frozenset(
            address for address, gpu in address_gpus.items() if local_gpu is not None and gpu == local_gpu
        )
        self.enabled = enabled and bool(self.same_gpu)
        self._collector: threading.Thread | None = None
        self._warned = False

    @classmethod
    def for_worker(
        cls,
        gpu: int | None,
        address: str,
        address_gpus: Mapping[str, int | None],
        environ: Mapping[str, str] = os.environ,
    ) -> "CudaIpc":
        """The policy of the worker serving `address` on placement GPU `gpu` (never to itself)."""
        enabled = not envs.CUDA_IPC.switched_off(environ)
        peers = {a: g for a, g in address_gpus.items() if a != address}
        return cls(gpu, peers, enabled)

    def shares_with(self, address: str | None) -> bool:
        """True when a CUDA tensor for `address` may go by handle: that worker is on this worker's GPU."""
        return self.enabled and address in self.same_gpu

    def encode(self, tensor: Any, message: Any) -> bool:
        """Fill a `Tensor` message with an IPC handle to `tensor`; False (message untouched) to copy instead."""
        if not tensor.is_cuda or tensor.numel() == 0:
            return False
        tensor = tensor.detach()
        try:
            record = _share(tensor)
        except RuntimeError:
            # Memory this process did not allocate itself (a tensor that arrived
            # by IPC) cannot be re-exported: share a device-side copy of it.
            try:
                record = _share(tensor.clone())
            except RuntimeError as error:
                self._warn_once(f"CUDA IPC unavailable ({error}); CUDA tensors go through host memory")
                return False
        message.framework = FRAMEWORK
        message.dtype = str(tensor.dtype)
        message.shape.extend(tensor.shape)
        message.data = json.dumps(record, separators=(",", ":")).encode()
        self._start_collector()
        return True

    def _start_collector(self) -> None:
        if self._collector is None:
            self._collector = threading.Thread(target=_collect_forever, name="stagevisor-cuda-ipc-collect", daemon=True)
            self._collector.start()

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("%s", message)


def _share(tensor: Any) -> dict[str, Any]:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = reduce_tensor(tensor)
    if rebuild is not rebuild_cuda_tensor:
        raise RuntimeError(f"torch reduced a CUDA tensor with {getattr(rebuild, '__name__', rebuild)}")
    (
        _,
        size,
        stride,
        offset,
        _,
        _,
        device,
        handle,
        storage_size,
        storage_offset,
        _,
        ref_handle,
        ref_offset,
        event_handle,
        event_sync,
    ) = args
    return {
        "size": list(size),
        "stride": list(stride),
        "offset": offset,
        "device": device,
        "handle": _hex(handle),
        "storage_size": storage_size,
        "storage_offset": storage_offset,
        "ref_counter_handle": _hex(ref_handle),
        "ref_counter_offset": ref_offset,
        "event_handle": _hex(event_handle),
        "event_sync_required": bool(event_sync),
    }


def _hex(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


def _record(message: Any) -> dict[str, Any]:
    record = json.loads(message.data)
    for name in _BYTES_FIELDS:
        if record.get(name) is not None:
            record[name] = bytes.fromhex(record[name])
    return record


def decode(message: Any) -> Any:
    """The CUDA tensor a handle message stands for, on this process's view of the sender's device."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    record = _record(message)
    dtype = getattr(torch, message.dtype.split(".", 1)[1])
    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size(record["size"]),
        tuple(record["stride"]),
        record["offset"],
        torch.storage.TypedStorage,
        dtype,
        record["device"],
        record["handle"],
        record["storage_size"],
        record["storage_offset"],
        False,
        record["ref_counter_handle"],
        record["ref_counter_offset"],
        record["event_handle"],
        record["event_sync_required"],
    )


def discard(message: Any) -> None:
    """Give back the sender's reference count of a handle that will never be decoded.

    Without torch here nothing can be given back: the sender's block stays parked until it exits.
    """
    try:
        import torch
    except ImportError:
        log.warning("a CUDA IPC tensor was dropped in a process without torch; its block stays with the sender")
        return

    record = _record(message)
    torch.UntypedStorage._release_ipc_counter_cuda(record["ref_counter_handle"], record["ref_counter_offset"])


def _collect_forever() -> None:
    import torch

    while True:
        time.sleep(COLLECT_INTERVAL)
        try:
            torch.cuda.ipc_collect()
        except Exception:  # noqa: BLE001 - a collector must not die; the next round retries
            log.debug("torch.cuda.ipc_collect failed", exc_info=True)
