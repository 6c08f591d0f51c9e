"""Does the default voice's acoustic pass give the same samples on one onnxruntime thread and on two?

Runs hibari's acoustic model (its own session, built by `hibari.Hibari`) on
`--texts` sentences generated from a fixed word list and seed, each at one
and at two intra-op threads and with two inter-op threads (the graph's
independent operators at once, each on one thread), interleaved, and prints
how many sentences' outputs differ in any bit from one thread's, and the
median time of each with its spread. Then the same for the model's two
halves, cut at its length regulator as bench_hibari_preview.py cuts it (its
attention is all in the phoneme half; the frame half is convolutional): each
half on two threads against the same half on one, the frame half fed the
phoneme half's one-thread outputs. A half that kept its bits on two threads
could take a spare core without changing a sample. For the sentences whose
outputs differ on two threads, it also prints how the audio served from them
differs (the package's DSP, seed 0, 16-bit PCM): the largest difference, the
share of samples that differ and the signal-to-difference ratio.

This is why stagevisor's acoustic session keeps one thread count for the
life of a worker (STAGEVISOR_ORT_THREADS, default 1) instead of taking a
spare core when a worker is idle: the thread count picks the float results,
so audio chosen by load would not be bit-identical across requests.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly vexing problems near the "
    "harbour lights tonight, and then every morning before noon our neighbours walk slowly along rivers; "
    "however nobody remembers which twelve bright windows opened"
).split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import os
    import tempfile

    import numpy as np
    import onnx
    import onnxruntime as ort
    from hibari import Hibari
    from onnx import utils

    from bench_hibari_preview import CUT_INPUTS  # this directory (the script's) is on sys.path

    one, two = Hibari(threads=1), Hibari(threads=2)
    # The graph's independent branches on two threads, each operator on one: the same arithmetic per operator.
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 2
    options.log_severity_level = 3
    parallel = ort.InferenceSession(one.model_path, options, providers=["CPUExecutionProvider"])
    sessions = {"1 thread": one.sess, "2 threads": two.sess, "2 inter-op threads, 1 per operator": parallel}

    def threaded(path: str, threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    outputs_named = [output.name for output in onnx.load(one.model_path).graph.output]
    with tempfile.TemporaryDirectory() as directory:
        phoneme_path, frame_path = os.path.join(directory, "phonemes.onnx"), os.path.join(directory, "frames.onnx")
        utils.extract_model(one.model_path, phoneme_path, ["ids", "speed"], list(CUT_INPUTS))
        utils.extract_model(one.model_path, frame_path, list(CUT_INPUTS), outputs_named)
        halves = {
            (half, threads): threaded(path, threads)
            for half, path in (("phoneme", phoneme_path), ("frame", frame_path))
            for threads in (1, 2)
        }
    half_differ = {half: 0 for half in ("phoneme", "frame")}
    half_times: dict[tuple[str, int], list[float]] = {key: [] for key in halves}
    draw = random.Random(args.seed)
    differ = dict.fromkeys(sessions, 0)
    heard: list[tuple[int, float, float]] = []
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(args.texts):
        text = " ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 40))) + "."
        feeds = {
            "ids": np.asarray([one.ids(one.phonemize(text)[0])], np.int64),
            "speed": np.asarray([draw.choice((0.8, 1.0, 1.3))], np.float32),
        }
        outputs = {}
        for name, session in sessions.items():
            started = time.perf_counter()
            outputs[name] = session.run(None, feeds)
            times[name].append(time.perf_counter() - started)
        for name in sessions:
            if not all(np.array_equal(a, b) for a, b in zip(outputs["1 thread"], outputs[name], strict=True)):
                differ[name] += 1
                if name == "2 threads":
                    heard.append(served_difference(outputs["1 thread"], outputs[name]))
        half_outputs = {}
        for threads in (1, 2):  # each half on one thread and on two; the frame half fed one thread's cut
            started = time.perf_counter()
            half_outputs["phoneme", threads] = halves["phoneme", threads].run(None, feeds)
            half_times["phoneme", threads].append(time.perf_counter() - started)
        cut = dict(zip(CUT_INPUTS, half_outputs["phoneme", 1], strict=True))
        for threads in (1, 2):
            started = time.perf_counter()
            half_outputs["frame", threads] = halves["frame", threads].run(None, cut)
            half_times["frame", threads].append(time.perf_counter() - started)
        if not all(np.array_equal(a, b) for a, b in zip(outputs["1 thread"], half_outputs["frame", 1], strict=True)):
            raise SystemExit("the model's two halves on one thread no longer give the whole pass's outputs")
        for half in half_differ:
            pairs = zip(half_outputs[half, 1], half_outputs[half, 2], strict=True)
            half_differ[half] += not all(np.array_equal(a, b) for a, b in pairs)
    print(f"{args.texts} sentences (seed {args.seed}), against 1 thread:")
    for name, values in times.items():
        print(
            f"  {name}: acoustic pass median {statistics.median(values) * 1000:.1f} ms "
            f"[{min(values) * 1000:.1f}-{max(values) * 1000:.1f}], "
            f"{statistics.median(values) / statistics.median(times['1 thread']):.2f}x; outputs differ for "
            f"{differ[name]}"
        )
    if heard:  # what a listener gets: the served 16-bit audio of the sentences whose outputs differ
        steps, shares, snrs = zip(*heard, strict=True)
        print(
            f"  the {len(heard)} sentences that differ on 2 threads, as served (the DSP, seed 0, 16-bit PCM): "
            f"largest difference median {statistics.median(steps):.0f} steps [{min(steps)}-{max(steps)}], "
            f"samples differing median {statistics.median(shares):.0%} [{min(shares):.0%}-{max(shares):.0%}], "
            f"signal to difference median {statistics.median(snrs):.0f} dB [{min(snrs):.0f}-{max(snrs):.0f}]"
        )
    print("the model cut at its length regulator (its two halves on one thread give the whole pass's bits):")
    for half, count in half_differ.items():
        medians = {threads: statistics.median(half_times[half, threads]) for threads in (1, 2)}
        print(
            f"  {half} half: median {medians[1] * 1000:.1f} ms on 1 thread, {medians[2] * 1000:.1f} ms on 2 "
            f"({medians[2] / medians[1]:.2f}x); on 2 threads its outputs differ for {count}"
        )
    return 0


def served_difference(one: list, two: list) -> tuple[int, float, float]:
    """How the audio served from two acoustic outputs differs: the largest difference in 16-bit steps, the share of
    samples that differ, and the signal-to-difference ratio in dB (the first's power over the difference's)."""
    import numpy as np
    from hibari import dsp

    from stagevisor.supervisor.dataplane.synthesis import to_pcm16

    pcm = [
        np.frombuffer(to_pcm16(dsp.synth(*(o[0] for o in out), np.random.default_rng(0))), "<i2").astype(np.int64)
        for out in (one, two)
    ]
    difference = pcm[0] - pcm[1]
    power = float(np.sum(pcm[0] ** 2)) / max(float(np.sum(difference**2)), 1.0)
    return int(np.abs(difference).max()), float(np.mean(difference != 0)), 10 * float(np.log10(power))


if __name__ == "__main__":
    raise SystemExit(main())
