"""Stage executors for the GPU tests: they allocate, hand over and check CUDA tensors, and report what torch sees.

Each writes a JSON report per request into $STAGEVISOR_GPU_TEST_DIR, named
`<stage>-<request option "tag">.json`, so the tests read what a worker saw
without any channel other than the daemon's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from stagevisor.stages.base import StagePayload, StageContext

REPORT_DIR = "STAGEVISOR_GPU_TEST_DIR"
MIB = 1 << 20


def pattern(nbytes: int, device: Any) -> Any:
    """The deterministic bytes a producer sends and a consumer expects: every byte value, in order."""
    import torch

    return (torch.arange(nbytes, dtype=torch.int64, device=device) % 251).to(torch.uint8)


def memory_report(torch: Any) -> dict[str, Any]:
    free, total = torch.cuda.mem_get_info()
    return {
        "pid": os.getpid(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "device_total": total,
    }


class _Reporting:
    def __init__(self, name: str, gpu_id: int | None) -> None:
        import torch

        self.torch = torch
        self.name = name
        self.device = torch.device("cuda", gpu_id) if gpu_id is not None else torch.device("cpu")

    def report(self, payload: StagePayload, **fields: Any) -> None:
        tag = payload.request["options"].get("tag", payload.request_id)
        body = {"stage": self.name, **(memory_report(self.torch) if self.device.type == "cuda" else {}), **fields}
        path = Path(os.environ[REPORT_DIR]) / f"{self.name}-{tag}.json"
        path.write_text(json.dumps(body))


class Allocator(_Reporting):
    """Allocates request option `alloc_<stage>` (a share of the device's memory) for the request, then frees it."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        share = float(payload.request["options"].get(f"alloc_{self.name}", "0"))
        total = self.torch.cuda.get_device_properties(self.device).total_memory
        block = self.torch.empty(int(share * total), dtype=self.torch.uint8, device=self.device)
        block.fill_(1)
        self.torch.cuda.synchronize(self.device)
        self.report(payload, held=block.numel())
        del block
        return dict(payload.data)


class Producer(_Reporting):
    """Sends option `mib` MiB of `pattern` bytes on its GPU to the next stage (0: report memory only)."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        nbytes = int(payload.request["options"].get("mib", "0")) * MIB
        if nbytes == 0:
            self.torch.cuda.synchronize(self.device)
            self.report(payload)
            return {}
        return {"tensor": pattern(nbytes, self.device)}


class Consumer(_Reporting):
    """Checks the tensor it receives against `pattern`, bit for bit, and reports where it arrived.

    With request option `forward=1` it hands the tensor on to the next stage; otherwise nothing of it
    outlives the request here.
    """

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any]:
        tensor = payload.data.pop("tensor", None)
        if tensor is None:
            return {}
        expected = pattern(tensor.numel(), tensor.device)
        self.report(
            payload,
            arrived_on=tensor.device.type,
            equal=bool(self.torch.equal(tensor, expected)),
            nbytes=tensor.numel(),
        )
        del expected
        return {"tensor": tensor} if payload.request["options"].get("forward") == "1" else {}


class Sink:
    """Terminal stage: a few samples of silence, so the Synthesize call completes."""

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        await ctx.stream({"audio": np.zeros(160, dtype=np.float32), "sample_rate": 16000})


def make_allocator(name: str, gpu_id: int | None = None) -> Allocator:
    return Allocator(name, gpu_id)


def make_producer(name: str, gpu_id: int | None = None) -> Producer:
    return Producer(name, gpu_id)


def make_consumer(name: str, gpu_id: int | None = None) -> Consumer:
    return Consumer(name, gpu_id)


def make_sink(name: str = "sink") -> Sink:
    return Sink()
