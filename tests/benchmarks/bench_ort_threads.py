"""Does the default voice's acoustic pass give the same samples on one onnxruntime thread and on two?

Runs hibari's acoustic model (its own session, built by `hibari.Hibari`) on
`--texts` sentences generated from a fixed word list and seed, each at one
and at two intra-op threads, interleaved, and prints how many sentences'
outputs differ in any bit, and the median time of each with its spread.

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
    from hibari import Hibari

    one, two = Hibari(threads=1), Hibari(threads=2)
    draw = random.Random(args.seed)
    differ = 0
    times: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.texts):
        text = " ".join(draw.choice(WORDS) for _ in range(draw.randint(3, 40))) + "."
        feeds = {
            "ids": np.asarray([one.ids(one.phonemize(text)[0])], np.int64),
            "speed": np.asarray([draw.choice((0.8, 1.0, 1.3))], np.float32),
        }
        outputs = {}
        for threads, tts in ((1, one), (2, two)):
            started = time.perf_counter()
            outputs[threads] = tts.sess.run(None, feeds)
            times[threads].append(time.perf_counter() - started)
        if not all(np.array_equal(a, b) for a, b in zip(outputs[1], outputs[2], strict=True)):
            differ += 1
    print(f"{args.texts} sentences (seed {args.seed}): outputs differ between 1 and 2 threads for {differ}")
    for threads, values in times.items():
        print(
            f"  {threads} thread(s): acoustic pass median {statistics.median(values) * 1000:.1f} ms "
            f"[{min(values) * 1000:.1f}-{max(values) * 1000:.1f}]"
        )
    print(f"  ratio of medians, 2 threads / 1: {statistics.median(times[2]) / statistics.median(times[1]):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
