"""The codec's errors, a leaf (it imports nothing of the project): the out-of-line, dtype and decoding modules
and the codec itself share them without a cycle."""

from __future__ import annotations


class CodecError(TypeError):
    """A value in `data` cannot cross a process boundary; the message says where and what."""


class TorchMissing(CodecError):
    """A torch tensor came to a process without torch installed; the message names the extra to install."""
