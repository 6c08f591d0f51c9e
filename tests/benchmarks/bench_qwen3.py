"""Benchmark: Qwen3-TTS served by stagevisor against qwen-tts's own generate() + decode, on a tiny random checkpoint.

One daemon (`stagevisor serve --model-path DIR`, the declared topology: one
`pipeline` process) and the package in this process take turns on the same
request (text, speaker, seed, frames), in alternating order, with the same
torch thread count on both sides (`--threads`). For each it
prints the median total time with its spread (min-max), the median of the
per-pair ratios (target: stagevisor <= 1.1x the package), and stagevisor's
time to first audio (the package has audio only once decoding ends).

    python tests/benchmarks/bench_qwen3.py [--repeats 9] [--frames 48] [--checkpoint DIR] [--isolate-vocoder]
                                           [--device cuda:0]

The package's model goes on the device the daemon's stages go to: cuda:0
where torch sees a GPU (the model's declaration puts its stages on GPU 0),
else the CPU.

Needs the qwen3 extra. Without --checkpoint it builds a tiny CustomVoice one in a
temporary folder (tests/qwen3_tiny.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TEXT = "The quick brown fox jumps over the lazy dog."
SPEAKER = "ryan"
SEED = 2024


def served(listen: str, frames: int) -> tuple[float, float, int]:
    """(total seconds, seconds to the first audio chunk, samples) of one Synthesize call."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    request = synthesis_pb2.SynthesizeRequest(
        text=TEXT, voice=SPEAKER, options={"seed": str(SEED), "max_new_tokens": str(frames)}
    )
    samples, first = 0, None
    with grpc.insecure_channel(listen) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        grpc.channel_ready_future(channel).result(timeout=30)
        started = time.perf_counter()
        for chunk in stub.Synthesize(request, timeout=600):
            if chunk.pcm and first is None:
                first = time.perf_counter() - started
            samples += len(chunk.pcm) // 2
        total = time.perf_counter() - started
    return total, first or total, samples


def package(model, frames: int) -> tuple[float, int]:
    """(total seconds, samples) of the package's generate_custom_voice: generate() then one whole decode."""
    import torch

    from stagevisor.stages.qwen3.request import Sampling

    kwargs = Sampling(max_new_tokens=frames).generate_kwargs()
    torch.manual_seed(SEED)
    started = time.perf_counter()
    (wav,), _ = model.generate_custom_voice(TEXT, speaker=SPEAKER, **kwargs)
    return time.perf_counter() - started, len(wav)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms  ({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--frames", type=int, default=48, help="max_new_tokens: frames per request (+1)")
    parser.add_argument("--checkpoint", help="a Qwen3-TTS checkpoint directory (default: a tiny random one)")
    parser.add_argument("--isolate-vocoder", action="store_true", help="serve with --isolate-stage vocoder")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for the package in this process and for the daemon's workers (OMP_NUM_THREADS), "
        "the same on both sides (default 1: on a loaded 2-core machine two threads made the package's generate "
        "7-14x slower)",
    )
    parser.add_argument("--device", help="where the package's model runs (default: cuda:0 with a GPU, else cpu)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")

    from qwen_tts import Qwen3TTSModel

    from tests.integration.daemon_helpers import ServeProcess
    from tests.qwen3_tiny import build

    with tempfile.TemporaryDirectory(prefix="bench-qwen3-") as scratch:
        checkpoint = args.checkpoint or str(build(Path(scratch) / "custom_voice", "custom_voice"))
        model = Qwen3TTSModel.from_pretrained(checkpoint, device_map=device)
        placement = ["--isolate-stage", "vocoder"] if args.isolate_vocoder else []
        threads = {"OMP_NUM_THREADS": str(args.threads)}  # torch's intra-op default in every worker
        with ServeProcess("--model-path", checkpoint, *placement, env=threads) as daemon:
            daemon.wait_serving(timeout=600)
            served(daemon.listen, args.frames)  # warm-up: first request pays lazy initialisation
            package(model, args.frames)
            ours: list[tuple[float, float, int]] = []
            theirs: list[tuple[float, int]] = []
            for index in range(args.repeats):
                if index % 2 == 0:
                    theirs.append(package(model, args.frames))
                    ours.append(served(daemon.listen, args.frames))
                else:
                    ours.append(served(daemon.listen, args.frames))
                    theirs.append(package(model, args.frames))
                print(
                    f"pair {index + 1}: package {theirs[-1][0] * 1000:.0f} ms, stagevisor {ours[-1][0] * 1000:.0f} ms "
                    f"(first audio {ours[-1][1] * 1000:.0f} ms)",
                    flush=True,
                )
    if {o[2] for o in ours} != {t[1] for t in theirs}:
        print(f"error: sample counts differ: stagevisor {ours[0][2]}, package {theirs[0][1]}", file=sys.stderr)
        return 1
    ratios = [o[0] / t[0] for o, t in zip(ours, theirs, strict=True)]
    seconds = ours[0][2] / 24000
    topology = "vocoder isolated" if args.isolate_vocoder else "declared (one process)"
    print(f"Qwen3-TTS, tiny random checkpoint, {ours[0][2] // 1920} frames ({seconds:.2f} s of audio), {topology}")
    print(f"the package on {device}; torch at {args.threads} intra-op thread(s) in this process and in each worker")
    print(f"medians of {args.repeats} interleaved requests (min-max):")
    print(f"  package generate() + decode, total : {spread([t[0] for t in theirs])}")
    print(f"  stagevisor, total                  : {spread([o[0] for o in ours])}")
    print(f"  stagevisor, time to first audio    : {spread([o[1] for o in ours])}")
    print(
        f"  stagevisor / package, total        : {statistics.median(ratios):.3f}x  "
        f"({min(ratios):.3f}-{max(ratios):.3f}); target <= 1.1x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
