"""A small torch TTS stand-in on the GPU: an engine that streams latent frames, a vocoder that decodes them.

Shaped like the demo voice (192-float latent frames, 256 samples each) so the
vocoder-isolation benchmark can run where the work is on a GPU. Deterministic:
fixed seeds, no sampling. GPU work runs in a thread so a worker's event loop
keeps serving its other requests meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from stagevisor.stages.base import StagePayload, StageContext

LATENT = 192
HOP = 256
CHUNK_FRAMES = 32
SAMPLE_RATE = 22050


def _device(gpu_id: int | None) -> Any:
    import torch

    return torch.device("cuda", gpu_id) if gpu_id is not None and torch.cuda.is_available() else torch.device("cpu")


class Engine:
    """Per chunk: `steps` autoregressive-like matmul steps, then one latent chunk streamed to the vocoder."""

    def __init__(self, gpu_id: int | None, width: int = 2048, steps: int = 24) -> None:
        import torch

        self.torch = torch
        self.device = _device(gpu_id)
        generator = torch.Generator().manual_seed(0)
        self.weight = (torch.randn(width, width, generator=generator) / width**0.5).to(self.device)
        self.project = (torch.randn(width, LATENT, generator=generator) / width**0.5).to(self.device)
        self.steps = steps

    def _chunk(self, index: int) -> Any:
        torch = self.torch
        with torch.inference_mode():
            state = torch.full((CHUNK_FRAMES, self.weight.shape[0]), 0.01 * (index + 1), device=self.device)
            for _ in range(self.steps):
                state = torch.tanh(state @ self.weight)
            latent = state @ self.project
            if latent.is_cuda:
                torch.cuda.current_stream(latent.device).synchronize()
            return latent

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        frames = max(CHUNK_FRAMES, 4 * len(payload.request["text"]))
        chunks = (frames + CHUNK_FRAMES - 1) // CHUNK_FRAMES
        for index in range(chunks):
            latent = await asyncio.to_thread(self._chunk, index)
            await ctx.stream({"latent": latent})
        return {"frames": chunks * CHUNK_FRAMES}


class Vocoder:
    """Decodes each latent chunk with a transposed-convolution stack to HOP samples per frame."""

    def __init__(self, gpu_id: int | None, channels: int = 512) -> None:
        import torch

        self.torch = torch
        self.device = _device(gpu_id)
        torch.manual_seed(0)
        layers, width = [], LATENT
        for out, stride in ((channels, 8), (channels // 2, 8), (channels // 4, 4)):
            layers += [
                torch.nn.ConvTranspose1d(width, out, 2 * stride, stride, padding=stride // 2),
                torch.nn.LeakyReLU(0.1),
                torch.nn.Conv1d(out, out, 7, padding=3),
                torch.nn.LeakyReLU(0.1),
            ]
            width = out
        layers += [torch.nn.Conv1d(width, 1, 7, padding=3), torch.nn.Tanh()]
        self.net = torch.nn.Sequential(*layers).to(self.device).eval()

    def _decode(self, latent: Any) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            x = latent.to(self.device).T.unsqueeze(0)  # (1, LATENT, frames)
            audio = self.net(x)[0, 0]
            return audio.float().cpu().numpy()

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        async for chunk in ctx.chunks():
            audio = await asyncio.to_thread(self._decode, chunk["latent"])
            await ctx.stream({"audio": audio, "sample_rate": SAMPLE_RATE})


def make_engine(gpu_id: int | None = None) -> Engine:
    return Engine(gpu_id)


def make_vocoder(gpu_id: int | None = None) -> Vocoder:
    return Vocoder(gpu_id)
