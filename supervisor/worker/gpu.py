"""Binding a worker to its group's GPU: the CUDA device, the group's memory fraction handed to the allocator, or
why neither could be (no CUDA here)."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Callable

from stagevisor.supervisor.worker.spec import WorkerSpec


@dataclass(frozen=True)
class GpuBinding:
    """Result of binding a group's GPU: the CUDA ordinal used, whether the fraction is enforced, the device."""

    gpu: int | None
    """The CUDA ordinal of the group's GPU in this process (WorkerSpec.local_gpu)."""
    fraction_enforced: bool
    warning: str | None = None
    device: str = ""
    """`cuda:<ordinal> (<name>, <uuid>)` when bound, `cpu` for GPU stages without CUDA, empty for a CPU group."""


def _describe_device(torch: Any, ordinal: int) -> str:
    try:
        props = torch.cuda.get_device_properties(ordinal)
    except Exception:  # noqa: BLE001 - a description only; binding already succeeded
        return f"cuda:{ordinal}"
    uuid = getattr(props, "uuid", None)
    return f"cuda:{ordinal} ({props.name}" + (f", GPU-{uuid})" if uuid else ")")


def bind_gpu(spec: WorkerSpec, import_module: Callable[[str], Any] = importlib.import_module) -> GpuBinding:
    """Select the group's GPU and cap this process's allocator at the group's fraction.

    Under isolation (the default) the worker was started with
    CUDA_VISIBLE_DEVICES naming only its group's GPU, which it sees as CUDA
    device 0 (a TP rank: its stage's GPUs, its own at index tp_rank). A group
    with no GPU stage never imports torch. Without torch or without a CUDA
    device the GPU stages run on CPU and the fraction is reported as not
    enforced, with one warning.
    """
    group = spec.group
    gpu_stages = [stage.name for stage in spec.stages if stage.gpu is not None]
    ordinal = spec.local_gpu
    if ordinal is None or not gpu_stages:
        return GpuBinding(None, False)
    try:
        torch = import_module("torch")
        has_cuda = bool(torch.cuda.is_available()) and torch.cuda.device_count() > ordinal
    except ImportError:
        torch, has_cuda = None, False
    if not has_cuda:
        where = f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})" if spec.isolated else ""
        warning = (
            f"no CUDA device {group.gpu}{where}: GPU stages of group {group.name!r} "
            f"({', '.join(gpu_stages)}) run on CPU; memory fraction not enforced"
        )
        return GpuBinding(ordinal, False, warning, device="cpu")
    torch.cuda.set_device(ordinal)
    device = _describe_device(torch, ordinal)
    if group.total_gpu_memory_fraction is None:
        return GpuBinding(ordinal, False, device=device)
    torch.cuda.set_per_process_memory_fraction(group.total_gpu_memory_fraction, ordinal)
    return GpuBinding(ordinal, True, device=device)
