"""Does the default voice's acoustic pass give the same samples on one onnxruntime thread and on two?

Runs hibari's acoustic model (its own session, built by `hibari.Hibari`) on
`--texts` sentences generated from a fixed word list and seed, each at one
and at two intra-op threads and with two inter-op threads (the graph's
independent operators at once, each on one thread), interleaved, and prints
how many sentences' outputs differ in any bit from one thread's, and the
median time of each with its spread.

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

    import numpy as np
    import onnxruntime as ort
    from hibari import Hibari

    one, two = Hibari(threads=1), Hibari(threads=2)
    # The graph's independent branches on two threads, each operator on one: the same arithmetic per operator.
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 2
    options.log_severity_level = 3
    parallel = ort.InferenceSession(one.model_path, options, providers=["CPUExecutionProvider"])
    sessions = {"1 thread": one.sess, "2 threads": two.sess, "2 inter-op threads, 1 per operator": parallel}
    draw = random.Random(args.seed)
    differ = dict.fromkeys(sessions, 0)
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
    print(f"{args.texts} sentences (seed {args.seed}), against 1 thread:")
    for name, values in times.items():
        print(
            f"  {name}: acoustic pass median {statistics.median(values) * 1000:.1f} ms "
            f"[{min(values) * 1000:.1f}-{max(values) * 1000:.1f}], "
            f"{statistics.median(values) / statistics.median(times['1 thread']):.2f}x; outputs differ for "
            f"{differ[name]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
