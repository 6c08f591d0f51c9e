"""Tensor dtypes across a process boundary: a numpy dtype's string, the dtype a peer's string names (checked, a
few remembered), and torch, imported only when a torch tensor is actually encoded or decoded."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from stagevisor.supervisor.dataplane.codec_errors import CodecError, TorchMissing
from stagevisor.supervisor.install import install_command

_DTYPE_STRS: dict[Any, str] = {}


def dtype_str(dtype: np.dtype) -> str:
    """The string a numpy dtype crosses as (its `.str`), remembered for plain dtypes."""
    name = _DTYPE_STRS.get(dtype)
    if name is None:
        name = dtype.str
        if dtype.isbuiltin and len(_DTYPE_STRS) < 256:  # plain dtypes only: equal ones have one string
            _DTYPE_STRS[dtype] = name
    return name


_WIDTHS = {1: "u1", 2: "<i2", 4: "<i4", 8: "<i8"}
_DTYPES: dict[str, tuple[np.dtype, str | None]] = {}
"""Tensor dtype strings already checked: (numpy dtype of the bytes, torch dtype name or None)."""


def tensor_dtype(name: str) -> tuple[np.dtype, str | None]:
    """The numpy dtype a tensor's bytes are read as, and its torch dtype name; CodecError when unknown."""
    cached = _DTYPES.get(name)
    if cached is not None:
        return cached
    torch_dtype = name if name.startswith("torch.") else None
    try:
        if torch_dtype:
            dtype = np.dtype(_WIDTHS[torch_dtype_of(torch_dtype).itemsize])
        else:
            dtype = np.dtype(name)
    except TorchMissing:  # its message says which extra to install
        raise
    except (TypeError, ValueError, KeyError, SyntaxError):
        raise CodecError(f"tensor dtype {name[:40]!r} is not a numpy or torch dtype") from None
    if len(_DTYPES) < 256:  # a peer may send any string: remember only a few
        _DTYPES[name] = (dtype, torch_dtype)
    return dtype, torch_dtype


def array_dtype(name: str) -> np.dtype:
    """The numpy dtype of a packed array's bytes; CodecError when the string is not a numpy dtype."""
    return tensor_dtype(name)[0]


def import_torch(dtype: str) -> Any:
    """The torch module; CodecError naming the extra to install when this process has no torch."""
    try:
        import torch
    except ImportError:
        raise TorchMissing(
            f"a torch tensor ({dtype[:40]}) came, but torch is not installed in this process: "
            f"{install_command('torch')}"
        ) from None
    return torch


def torch_dtype_of(name: str) -> Any:
    """The torch dtype `name` ("torch.bfloat16") names; CodecError when it names none, TorchMissing without torch."""
    torch = import_torch(name)
    dtype = getattr(torch, name.split(".", 1)[1], None)
    if not isinstance(dtype, torch.dtype):
        raise CodecError(f"{name[:40]!r} is not a torch dtype")
    return dtype


def is_torch_tensor(obj: Any) -> bool:
    # Checked by module name so torch is never imported just to ask.
    module = type(obj).__module__
    return module.startswith("torch") and "torch" in sys.modules and isinstance(obj, sys.modules["torch"].Tensor)
