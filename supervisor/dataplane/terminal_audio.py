"""What a terminal stage's chunk must be to reach a client: mono float audio at one whole, positive rate."""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_SAMPLE_RATE = 2**31 - 1
"""The largest rate an AudioChunk (synthesis.proto: int32 sample_rate) carries to a gRPC client."""


def audio_problem(chunk: Any) -> str | None:
    """What makes a terminal chunk unplayable (not a dict, no audio, text bytes, integer samples, several
    channels, a sample rate that is not a positive whole number or is past MAX_SAMPLE_RATE), or None.

    Checked where the chunk arrives, and only here: every endpoint (gRPC, HTTP, WebSocket) then fails the
    request naming the stage instead of failing in the daemon (bytes, a rate of "16k") or playing noise
    (int16 PCM read as floats, channels interleaved). Values are not echoed: the message reaches the client.
    """
    if not isinstance(chunk, dict):
        return f"a chunk of type {type(chunk).__name__}, not a dict"
    if "audio" not in chunk:
        return "a chunk without 'audio'"
    if "sample_rate" not in chunk:
        return "'audio' without a 'sample_rate'"
    rate = chunk["sample_rate"]
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        return f"'sample_rate' of type {type(rate).__name__}, not a positive int"
    if not (rate > 0 and float(rate).is_integer()):
        return f"'sample_rate' {float(rate):g}, not a positive int"
    if rate > MAX_SAMPLE_RATE:  # gRPC's AudioChunk.sample_rate is an int32: the daemon failed writing it
        return f"'sample_rate' {float(rate):g}, more than the {MAX_SAMPLE_RATE} Hz an AudioChunk carries"
    audio = chunk["audio"]
    if isinstance(audio, (bytes, bytearray, memoryview, str)):
        return f"'audio' as {type(audio).__name__}, not an array of float samples"
    shape = tuple(getattr(audio, "shape", ()))
    if sum(1 for size in shape if size > 1) > 1:
        return f"'audio' of shape {list(shape)}: several channels, where it must be mono"
    floating = getattr(audio, "is_floating_point", None)  # a torch tensor
    if callable(floating):
        return None if floating() else f"'audio' of dtype {audio.dtype}, not float samples in [-1, 1]"
    if isinstance(audio, np.ndarray) and audio.dtype.kind != "f":
        return f"'audio' of dtype {audio.dtype}, not float samples in [-1, 1]"
    return None


def unplayable(stage: str, problem: str) -> str:
    """The client's message when terminal stage `stage` streamed a chunk with `problem` (`audio_problem`'s)."""
    return (
        f"stage {stage!r} streamed {problem}; a terminal stage streams "
        "{'audio': a 1-D float32 numpy array in [-1, 1], 'sample_rate': int}, one rate per request "
        "(see stages/README.md)"
    )
