"""Benchmark: concurrent Qwen3-TTS requests taking turns on the talker (`max_streams`) against one at a time.

The three stages in this process (as one `pipeline` worker runs them) on a tiny
random CustomVoice checkpoint: `--concurrency` requests arrive at once, served
by an engine with `max_streams` 1 (one request at a time) and with
`--max-streams` (they take turns, a step each), alternating, `--repeats` times.
Prints per configuration the medians over repeats of the requests' median and
slowest time to first audio and of the time until all have ended, with their
spread (min-max), and the ratios between configurations, medians of per-repeat
ratios.

    python tests/benchmarks/bench_qwen3_turns.py [--repeats 7] [--concurrency 4] [--max-streams 4] [--frames 24]

Needs the qwen3 extra.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEXT = "The quick brown fox jumps over the lazy dog."


class Edge:
    """A stream_to edge in one process, with the time the vocoder streamed its first audio."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.cancelled = False
        self.queue: asyncio.Queue = asyncio.Queue()
        self.first_audio: float | None = None

    async def stream(self, chunk: Any) -> None:
        if "audio" in chunk:
            if self.first_audio is None:
                self.first_audio = time.perf_counter()
        else:
            await self.queue.put(chunk)

    async def chunks(self) -> AsyncIterator[Any]:
        while (chunk := await self.queue.get()) is not None:
            yield chunk


async def burst(stages: tuple, engine: Any, concurrency: int, frames: int) -> tuple[list[float], float]:
    """Each request's time to first audio and the time until all ended, for `concurrency` requests sent at once."""
    from stagevisor.stages.base import StagePayload

    preprocessing, _, vocoder = stages
    started = time.perf_counter()

    async def one(index: int) -> float:
        request_id = f"r{index}"
        request = {"text": TEXT, "voice": "ryan", "options": {"seed": str(index), "max_new_tokens": str(frames)}}
        edge = Edge(request_id)
        data = await preprocessing.process(StagePayload(request_id, request), edge)

        async def generate() -> None:
            await engine.process(StagePayload(request_id, request, data), edge)
            await edge.queue.put(None)

        await asyncio.gather(generate(), vocoder.process(StagePayload(request_id, request), edge))
        assert edge.first_audio is not None
        return edge.first_audio - started

    firsts = await asyncio.gather(*(one(index) for index in range(concurrency)))
    return list(firsts), time.perf_counter() - started


def spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms  ({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-streams", type=int, default=4)
    parser.add_argument("--frames", type=int, default=24, help="max_new_tokens: frames per request (+1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    logging.getLogger("stagevisor").setLevel(logging.ERROR)  # each request reaches --frames: one warning a request
    import torch

    torch.set_num_threads(args.threads)
    from stagevisor.stages import qwen3
    from stagevisor.stages.qwen3.executors import TtsEngine
    from tests.qwen3_tiny import build

    with tempfile.TemporaryDirectory(prefix="bench-qwen3-turns-") as scratch:
        checkpoint = str(build(Path(scratch) / "custom_voice", "custom_voice"))
        engine = qwen3.tts_engine(checkpoint, dtype="float32")
        stages = (qwen3.preprocessing(checkpoint), engine, qwen3.vocoder(checkpoint, dtype="float32"))
        engines = {
            name: TtsEngine(engine.loaded, engine.first_chunk_frames, engine.chunk_frames, streams)
            for name, streams in (("one at a time", 1), (f"max_streams {args.max_streams}", args.max_streams))
        }
        asyncio.run(burst(stages, engines["one at a time"], args.concurrency, args.frames))  # warm-up
        results: dict[str, list[tuple[list[float], float]]] = {name: [] for name in engines}
        for index in range(args.repeats):
            order = list(engines) if index % 2 == 0 else list(reversed(engines))
            for name in order:
                results[name].append(asyncio.run(burst(stages, engines[name], args.concurrency, args.frames)))
            print(f"repeat {index + 1} done", flush=True)
    print(
        f"Qwen3-TTS, tiny random checkpoint, {args.concurrency} requests at once, {args.frames - 1} frames each, "
        f"torch at {args.threads} thread(s); medians of {args.repeats} interleaved repeats (min-max):"
    )
    for name, runs in results.items():
        print(f"  {name}:")
        print(f"    first audio, median request  : {spread([statistics.median(firsts) for firsts, _ in runs])}")
        print(f"    first audio, slowest request : {spread([max(firsts) for firsts, _ in runs])}")
        print(f"    all requests ended           : {spread([total for _, total in runs])}")
    one, turns = (results[name] for name in engines)
    for label, measure in (
        ("first audio, median request", lambda run: statistics.median(run[0])),
        ("first audio, slowest request", lambda run: max(run[0])),
        ("all requests ended", lambda run: run[1]),
    ):
        ratios = [measure(b) / measure(a) for a, b in zip(one, turns, strict=True)]
        print(
            f"  taking turns / one at a time, {label}: {statistics.median(ratios):.3f}x "
            f"({min(ratios):.3f}-{max(ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
