"""Streaming decode of 12 Hz codec frames to 24 kHz PCM: each chunk decoded after up to `left_context` earlier frames.

The speech tokenizer's decoder is causal (causal convolutions, right-trimmed
transposed convolutions, a transformer with causal sliding-window attention
of 72 frames), so a chunk decoded after its preceding frames gives the samples
a whole decode gives them, up to what lies beyond the left context: with at
least as many context frames as the utterance has before the chunk, only
floating-point summation order differs. The samples of the context frames are
dropped; each chunk yields 1,920 samples per frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

DEFAULT_LEFT_CONTEXT = 72
"""Frames of context per chunk: the decoder transformer's attention window (as vllm-omni decodes)."""


class StreamingDecoder:
    """Decodes one request's frames chunk by chunk; keeps the last `left_context` frames as context."""

    def __init__(self, tokenizer: Any, left_context: int = DEFAULT_LEFT_CONTEXT) -> None:
        if left_context < 0:
            raise ValueError("left_context must be >= 0")
        self.decoder = tokenizer.model.decoder
        self.device = tokenizer.device
        self.samples_per_frame = int(tokenizer.model.get_decode_upsample_rate())
        self.left_context = left_context
        self.history = np.zeros((0, 16), dtype=np.int64)

    def prime(self, context: np.ndarray) -> None:
        """Frames that precede the stream without being spoken (a cloned voice's reference codes)."""
        frames = np.asarray(context, dtype=np.int64).reshape(-1, 16)
        self.history = frames[max(0, len(frames) - self.left_context) :]

    @torch.inference_mode()
    def push(self, codes: np.ndarray) -> np.ndarray:
        """float32 samples in [-1, 1] for `codes` (frames, 16), decoded after the kept context."""
        codes = np.asarray(codes, dtype=np.int64).reshape(-1, 16)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        window = np.concatenate([self.history, codes]) if len(self.history) else codes
        tensor = torch.from_numpy(window).to(self.device).clamp(min=0).transpose(0, 1).unsqueeze(0)
        wav = self.decoder(tensor)[0, 0, len(self.history) * self.samples_per_frame :]
        self.history = window[max(0, len(window) - self.left_context) :]
        return wav.to(torch.float32).cpu().numpy()
