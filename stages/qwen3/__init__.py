"""Qwen3-TTS's real executors (qwen-tts, Apache-2.0; the `qwen3` extra): factories for its three stages.

Factories: `stagevisor.stages.qwen3:preprocessing`, `:tts_engine`, `:vocoder`.
Each receives the worker's `model_path` (a local checkpoint directory or a hub
id in the local Hugging Face cache) and `gpu_id`; `dtype` (auto, float32,
bfloat16, float16) and the chunking arguments come from the stage's `args`.
This module imports neither torch nor qwen-tts until a factory runs.
"""

from __future__ import annotations

import logging
from typing import Any

from stagevisor.stages.extras import QWEN3
from stagevisor.stages.qwen3.checkpoint import CheckpointError, locate, qwen_tts_available

log = logging.getLogger(__name__)


def _checkpoint(model_path: str | None) -> Any:
    if not qwen_tts_available():
        # The hint `serve`, `check` and `bench` give before any worker starts (stages/extras.py), in the same words.
        raise CheckpointError(
            "QWEN3_EXTRA_MISSING",
            f"qwen-tts, torch or torchaudio is not importable; install the 'qwen3' extra: {QWEN3.install_hint()}",
        )
    return locate(model_path)


def preprocessing(model_path: str | None = None, gpu_id: int | None = None, cached_references: int = 64) -> Any:
    """Chat template, tokens, reference codes and prompt embedding (with its process's tts_engine model).

    `gpu_id` is accepted and ignored on purpose: this stage loads nothing of its own. It computes with the model
    the tts_engine of its process loaded (`loading.loaded_model`) and puts every tensor on that model's device, so
    it runs where the engine runs; the two must share a process (the declaration marks the edge unsafe), and
    declared without a GPU it is handed None anyway.
    """
    from stagevisor.stages.qwen3.executors import Preprocessing

    return Preprocessing(_checkpoint(model_path), cached_references)


def tts_engine(
    model_path: str | None = None,
    gpu_id: int | None = None,
    dtype: str = "auto",
    first_chunk_frames: int = 1,
    chunk_frames: int = 25,
    max_streams: int = 4,
) -> Any:
    """Loads the checkpoint on the group's device and runs talker + code predictor, `max_streams` requests in turn."""
    from stagevisor.stages.qwen3.executors import TtsEngine
    from stagevisor.stages.qwen3.loading import device_for, dtype_for, load_model

    checkpoint = _checkpoint(model_path)
    device = device_for(gpu_id)
    torch_dtype = dtype_for(dtype, checkpoint.dtype, device)
    engine = TtsEngine(load_model(checkpoint, device, torch_dtype), first_chunk_frames, chunk_frames, max_streams)
    # The one line that says which checkpoint this daemon serves: --model-path may be a hub id or a key.
    log.info("serving %s (on %s, %s)", checkpoint.summary(), device, str(torch_dtype).removeprefix("torch."))
    return engine


def vocoder(
    model_path: str | None = None,
    gpu_id: int | None = None,
    dtype: str = "auto",
    left_context_frames: int = 72,
) -> Any:
    """The speech tokenizer's decoder on the group's device."""
    from stagevisor.stages.qwen3.executors import Vocoder
    from stagevisor.stages.qwen3.loading import device_for, dtype_for, speech_tokenizer

    checkpoint = _checkpoint(model_path)
    device = device_for(gpu_id)
    torch_dtype = dtype_for(dtype, checkpoint.dtype, device)
    return Vocoder(speech_tokenizer(checkpoint, device, torch_dtype), left_context_frames)
