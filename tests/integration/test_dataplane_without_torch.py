"""The data plane where `import torch` fails: numpy payloads cross processes, a torch frame is a clear error.

Each worker here makes torch unimportable before it builds its stages (as on a
machine without torch); the gateway in this process does the same for the test's
duration. The second test needs torch in the sending worker only.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc
import numpy as np
import pytest

from stagevisor.stages.base import StagePayload
from tests.integration.dataplane_stages import Cluster, Engine, Tokenize, Vocoder, synthesize

TEXT = "torch is not needed to speak"


class WithoutTorch:
    """A stage built in a worker where `import torch` raises ImportError from then on."""

    def __init__(self, inner: type, **kwargs: Any) -> None:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` now fails in this process
        self.inner = inner(**kwargs)

    async def process(self, payload: StagePayload, ctx: Any) -> Any:
        return await self.inner.process(payload, ctx)


class TorchEngine:
    """Streams one torch tensor per word when the request asks for torch, numpy ones otherwise."""

    async def process(self, payload: StagePayload, ctx: Any) -> dict:
        words = payload.data["words"]
        use_torch = payload.request["options"].get("torch") == "1"
        for index, word in enumerate(words):
            latent = np.full((4, 8), float(len(word) + index), dtype=np.float32)
            if use_torch:
                import torch

                latent = torch.from_numpy(latent)
            await ctx.stream({"index": index, "latent": latent})
        return {"count": len(words)}


def hidden(stage: type) -> tuple[type, dict]:
    return WithoutTorch, {"inner": stage}


CHAIN = [
    ("tokenize", "pipeline", ["engine"], []),
    ("engine", "engine", ["vocoder"], ["vocoder"]),
    ("vocoder", "vocoder", [], []),
]


def run_cluster(factories: dict, requests: list[dict]) -> list[Any]:
    """Start the three-process chain, run the requests at once, stop it; each result is chunks or the RPC error."""

    async def one(cluster: Cluster, options: dict) -> Any:
        try:
            async with cluster.channel() as channel:
                return await synthesize(channel, TEXT, **options)
        except grpc.aio.AioRpcError as error:
            return error

    async def main() -> list[Any]:
        cluster = await Cluster(CHAIN, factories).start()
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(cluster, r) for r in requests)), 60)
        finally:
            await cluster.stop()

    return asyncio.run(main())


def test_a_chain_split_over_three_workers_without_torch_streams_its_audio(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # the gateway too
    factories = {"tokenize": hidden(Tokenize), "engine": hidden(Engine), "vocoder": hidden(Vocoder)}
    [chunks] = run_cluster(factories, [{}])
    assert not isinstance(chunks, Exception), chunks
    assert len(chunks) == len(TEXT.split())


@pytest.mark.torch  # the sending worker needs it
def test_a_torch_tensor_sent_to_a_worker_without_torch_fails_its_request_naming_the_extra(caplog):
    factories = {"tokenize": (Tokenize, {}), "engine": (TorchEngine, {}), "vocoder": hidden(Vocoder)}
    failed, fine = run_cluster(factories, [{"torch": "1"}, {}])
    assert isinstance(failed, grpc.aio.AioRpcError)
    assert failed.code() == grpc.StatusCode.INTERNAL
    assert "torch is not installed in this process" in caplog.text and "[torch]" in caplog.text
    assert not isinstance(fine, Exception) and len(fine) == len(TEXT.split())
