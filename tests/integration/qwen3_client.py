"""One seeded Qwen3-TTS request, served and in the package: the served side over gRPC (`call`), and qwen-tts's own
generate() + decode of the same request (`package_pcm`), rounded as the service rounds, for the CPU and GPU tiers."""

from __future__ import annotations

from typing import Any

import numpy as np

TEXT = "The quick brown fox jumps over the lazy dog."
SEED = "4321"
FRAMES = 30
PCM_BOUND = 1
"""16-bit steps. In process the streamed float samples are within 1e-5 of the whole decode (test_qwen3_stages.py);
the service truncates to 16 bits, so a sample that lies at a step boundary may land one step away."""


def call(listen: str, voice: str = "", **extra: Any) -> tuple[np.ndarray, Any, list[int]]:
    """One Synthesize call: (int16 samples, the timings of the last chunk, each audio chunk's sample count)."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    request = synthesis_pb2.SynthesizeRequest(
        text=TEXT, voice=voice, options={"seed": SEED, "max_new_tokens": str(FRAMES)}, timings=True, **extra
    )
    pcm, sizes, timings = bytearray(), [], None
    with grpc.insecure_channel(listen) as channel:
        for chunk in synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(request, timeout=300):
            if chunk.pcm:
                pcm += chunk.pcm
                sizes.append(len(chunk.pcm) // 2)
                assert chunk.sample_rate == 24000
            if chunk.HasField("timings"):
                timings = chunk.timings
    return np.frombuffer(bytes(pcm), dtype="<i2"), timings, sizes


def package_pcm(directory: str, device: str = "cpu", **generate: Any) -> np.ndarray:
    """qwen-tts's own generate() + decode for the same request, rounded to 16 bits as the service rounds."""
    import torch
    from qwen_tts import Qwen3TTSModel

    from stagevisor.stages.qwen3.request import Sampling
    from stagevisor.supervisor.dataplane.synthesis import to_pcm16

    torch.set_num_threads(1)
    model = Qwen3TTSModel.from_pretrained(directory, device_map=device)
    torch.manual_seed(int(SEED))
    method = model.generate_custom_voice if "speaker" in generate else model.generate_voice_clone
    (wav,), rate = method(TEXT, **generate, **Sampling(max_new_tokens=FRAMES).generate_kwargs())
    assert rate == 24000
    return np.frombuffer(to_pcm16(wav), dtype="<i2")
