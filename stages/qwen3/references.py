"""Reference voices encoded once: a cloned voice used again skips the speaker encoder and the speech tokenizer.

A service that clones voices mostly clones the same few again and again (a
saved voice, an app's narrator). Encoding a reference is the costly part of
preprocessing such a request: the speaker encoder over the resampled audio
and, to clone in context, the speech tokenizer's encoder over all of it. The
results depend on the WAV bytes alone, so they are kept by the SHA-256 of
those bytes, least recently used first out, up to `capacity` voices (a few
tens of kilobytes each). The transcript is tokenized per request: it is cheap,
and the same audio may come with another transcript.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable

import torch

DEFAULT_CAPACITY = 64
"""Voices kept (stage arg `cached_references` of preprocessing); 0 keeps none."""


@dataclass(frozen=True)
class EncodedReference:
    """What a reference's WAV bytes encode to; tensors on the model's device, never written to."""

    speaker_embedding: torch.Tensor
    codes: torch.Tensor | None = None
    """(frames, 16): encoded only once a request clones this voice in context."""


class ReferenceCache:
    """Encoded references by the SHA-256 of their WAV bytes, least recently used evicted first. Thread-safe."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError(f"cached_references must be >= 0, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, EncodedReference] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def encoded(
        self,
        wav: bytes,
        in_context: bool,
        embed: Callable[[], torch.Tensor],
        encode: Callable[[], torch.Tensor],
    ) -> EncodedReference:
        """`wav`'s speaker embedding, and its codes when `in_context`: kept ones, or made by `embed` and `encode`.

        Two requests with a new voice at once may both encode it (the same result); neither waits for the other.
        """
        key = hashlib.sha256(wav).digest()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
        if entry is None:
            entry = EncodedReference(embed())
        if in_context and entry.codes is None:
            entry = replace(entry, codes=encode())
        if self.capacity:
            with self._lock:
                kept = self._entries.get(key)
                if kept is None or kept.codes is None:  # never replace codes with none
                    self._entries[key] = entry
                self._entries.move_to_end(key)
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
        return entry
