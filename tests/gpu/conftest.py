"""tests/gpu: run only where torch sees a CUDA device; everywhere else every test is skipped with the reason."""

from __future__ import annotations

import glob

import pytest


def _cuda_reason() -> str | None:
    if not glob.glob("/dev/nvidia[0-9]*"):
        # Decided without importing torch, which takes seconds on a machine that has no GPU anyway.
        return "no NVIDIA device (/dev/nvidia*); the GPU tests run with tests/gpu/run.sh on a CUDA machine"
    try:
        import torch
    except ImportError:
        return "torch is not installed; the GPU tests run with tests/gpu/run.sh on a CUDA machine"
    if not torch.cuda.is_available():
        return "no CUDA device; the GPU tests run with tests/gpu/run.sh on a CUDA machine"
    return None


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if "tests/gpu/" in item.nodeid.replace("\\", "/")]
    reason = _cuda_reason() if ours else None
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
