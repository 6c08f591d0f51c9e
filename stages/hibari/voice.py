"""The hibari voice (hibari-tts, Apache-2.0): its G2P, acoustic ONNX model and iSTFT DSP, loaded once per process.

hibari synthesizes in three steps, which the executors (stages/hibari/executors.py)
run as three stages: G2P (text -> phoneme ids per sentence, pure Python), the
acoustic model (ids -> five 601-bin spectral parameter frames and F0 at 80
frames/s) and the DSP (frames -> 24 kHz waveform, with a noise component drawn
from a numpy Generator). With the same seed, the same ids and the same
onnxruntime thread count, the stages produce exactly the samples of
`hibari.Hibari(...)(text, speed, seed)`: they call the package's own G2P and
session, and render its DSP in pieces with the same arithmetic in the same
order (stages/hibari/render.py), with one Generator per request advanced
sentence by sentence.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from stagevisor.stages.base import InvalidRequest, selects_voice
from stagevisor.stages.codes import (
    CONFLICTING_OPTIONS,
    INVALID_OPTION,
    TEXT_TOO_COMPLEX,
    TEXT_UNREADABLE,
    UNKNOWN_OPTION,
    UNKNOWN_VOICE,
)
from stagevisor.stages.compute import threads_from_env
from stagevisor.stages.preprocessing import cut_long_chunk
import stagevisor.supervisor.envs as envs
from stagevisor.supervisor.errors import shown
from stagevisor.supervisor.numbers import decimal, integer_text

log = logging.getLogger(__name__)

VOICE = "heart"
"""The voice hibari ships inside its wheel (American English, from Kokoro-82M's af_heart)."""
VOICE_NAMES = frozenset({"", "default", VOICE, "af_heart"})
"""What a request's `voice` may say to select it ("" and "default": no preference)."""
SAMPLE_RATE = 24000
HOP_SAMPLES = 300
"""Samples per acoustic frame (12.5 ms)."""
SPECTRAL_PARTS = ("lh", "theta", "ln", "lr", "phi")
"""The acoustic model's spectral outputs, each (601, frames) float32, in the order `hibari.dsp.synth` takes them."""
BINS = 601

SPEED_RANGE = (0.25, 4.0)
"""Accepted pace (1.0 is the teacher's pace): the OpenAI speech API's range. Above about 2.0 the voice
speeds up less than asked."""
SEED_MAX = 2**32 - 1
DEFAULT_SEED = 0
"""The noise seed of a request that names none: the same text gives the same audio, run to run."""


@dataclass(frozen=True)
class HibariOptions:
    """A request's validated synthesis options."""

    speed: float = 1.0
    seed: int = DEFAULT_SEED

    def as_dict(self) -> dict[str, Any]:
        return {"speed": self.speed, "seed": self.seed}


def _number(name: str, raw: Any) -> float:
    try:
        value = decimal(str(raw).strip())
    except ValueError:
        value = math.nan
    low, high = SPEED_RANGE
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidRequest(
            f"option {name!r} must be a number in [{low:g}, {high:g}], got {raw!r}", code=INVALID_OPTION, field=name
        )
    return value


def parse_options(options: Mapping[str, Any] | None, request_seed: Any = None) -> HibariOptions:
    """Validate a request's string option map.

    `speed` (0.25 slow .. 4.0 fast), or `length_scale` (its inverse, the name
    the OpenAI-compatible API maps `speed` to), and `seed` (a whole number in
    [0, 2**32 - 1]: the noise component; the default makes audio repeatable).
    `request_seed` is the request's own `seed` field (the HTTP API's), used
    when the options name none. Raises InvalidRequest naming the option for
    anything else.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - {"speed", "length_scale", "seed"})
    if unknown:
        raise InvalidRequest(
            f"unknown option {unknown[0]!r} for the hibari voice; supported options: length_scale, seed, speed",
            code=UNKNOWN_OPTION,
            field=unknown[0],
        )
    if "speed" in options and "length_scale" in options:
        raise InvalidRequest(
            "give either option 'speed' or 'length_scale' (its inverse), not both",
            code=CONFLICTING_OPTIONS,
            field="length_scale",
        )
    speed = 1.0
    if "speed" in options:
        speed = _number("speed", options["speed"])
    elif "length_scale" in options:
        speed = 1.0 / _number("length_scale", options["length_scale"])
    seed = DEFAULT_SEED
    if "seed" in options and request_seed is not None:
        raise InvalidRequest(
            "give the seed either as the request's 'seed' or as option 'seed', not both",
            code=CONFLICTING_OPTIONS,
            field="seed",
        )
    if request_seed is not None:
        options["seed"] = request_seed
    if "seed" in options:
        number = integer_text(str(options["seed"]))  # 7.0 too, as the HTTP API and Qwen3-TTS take it
        if number is None or not 0 <= number <= SEED_MAX:
            raise InvalidRequest(
                f"option 'seed' must be a whole number in [0, {SEED_MAX}], got {shown(options['seed'])}",
                code=INVALID_OPTION,
                field="seed",
            )
        seed = number
    return HibariOptions(speed, seed)


def check_voice(requested: Any) -> None:
    """InvalidRequest unless `requested` selects the bundled voice (in any case)."""
    if requested is None:
        return
    if not isinstance(requested, str) or not selects_voice(requested, VOICE_NAMES):
        accepted = ", ".join(repr(n) for n in sorted(VOICE_NAMES) if n)  # "" (no preference) is no name to offer
        raise InvalidRequest(
            f"voice {requested!r} is not available; the hibari voice answers to {accepted}",
            code=UNKNOWN_VOICE,
            field="voice",
        )


def describe_voice() -> dict[str, Any]:
    """The voice as executors declare it (GET /v1/audio/voices)."""
    return {
        "id": VOICE,
        "name": VOICE,
        "language": "en_US",
        "sample_rate": SAMPLE_RATE,
        "aliases": sorted(n for n in VOICE_NAMES if n and n != VOICE),
    }


@functools.lru_cache(maxsize=1)
def shared_g2p() -> Any:
    """The process's G2P (American English): pure-Python tables, about 1-3 s to build.

    Fork-safe to build: it opens no session and starts no thread (its
    out-of-vocabulary network is an onnxruntime session made on first use,
    which `Phonemizer` does after the fork). The fork server builds it before
    forking workers (stages/hibari/preload.py).
    """
    from hibari.g2p import G2P

    started = time.perf_counter()
    g2p = G2P(british=False)
    log.info("hibari G2P built in %.2fs", time.perf_counter() - started)
    return g2p


G2P_BUDGET = 1_000_000
"""The most G2P work one request may ask for, in pieces cubed (`g2p_work`): about half a second of the G2P here at
worst (5000 characters of prose ask for a few thousand)."""
MAX_CHUNK_PHONEMES = 800
"""A chunk longer than this (twice the package's MAX_PHONEMES) is cut at word boundaries into chunks of at most the
package's MAX_PHONEMES. The package cuts long sentences only at clause punctuation, so unpunctuated text (a
transcript, a list) made one chunk of thousands of phonemes, whose acoustic pass grows faster than its length: 4000
ids took 4 s and 630 MB here. Texts whose chunks stay within this are cut exactly as the package cuts them."""


def g2p_work(text: str, subtokens: re.Pattern[str]) -> tuple[int, str, int]:
    """(the G2P work `text` asks for, the word that asks most, that word's work): each whitespace-separated word's
    pieces cubed, `subtokens` (the package's SUBTOKEN_RE) finding the pieces.

    The package's G2P splits a word into pieces (letters, digits, each symbol or
    joiner: hyphens, slashes, %, emoji, marks) and searches spans of them for a
    known word; the search's cost grows as the cube of the pieces, with the one
    G2P lock held: "well-" repeated 500 times took 290 s here, "%" 500 times
    18 s. It is an upper bound: some runs of one mark ("====") the G2P reads as
    separate tokens, cheaply.
    """
    total, worst, worst_pieces = 0, "", 0
    for word in text.split():
        pieces = len(subtokens.findall(word))
        total += pieces**3
        if pieces > worst_pieces:
            worst, worst_pieces = word, pieces
    return total, worst, worst_pieces**3


def longest_number(sentence: str) -> int:
    """The most digits in one whitespace-separated word of `sentence` (separators such as , ' . between them do
    not end a number for the package's reader)."""
    return sum(c.isdigit() for c in longest_number_word(sentence))


def longest_number_word(sentence: str) -> str:
    """The whitespace-separated word of `sentence` with the most digits ("" when none has one)."""
    return max(sentence.split(), key=lambda word: sum(c.isdigit() for c in word), default="")


class Phonemizer:
    """Text -> phoneme ids per sentence, exactly as `hibari.Hibari.phonemize` and `ids` cut and map them, within
    bounds a server needs: G2P work per request (`G2P_BUDGET`) and phonemes per chunk (`MAX_CHUNK_PHONEMES`).

    A text is read a sentence at a time (`sentences`, then `sentence_ids` on each), so a server can hand on the
    first sentence's ids before the G2P has read the rest: the package phonemizes each of its `split_sentences`
    on its own, and a sentence split again is itself (tests/unit/stages/test_hibari.py holds both).
    """

    def __init__(self) -> None:
        from hibari import Hibari
        from hibari.g2p import SUBTOKEN_RE
        from hibari.g2p.numbers import SCALES
        from hibari.tts import MAX_PHONEMES

        g2p = shared_g2p()
        self._oov = g2p.oov  # its onnxruntime session, made here (after any fork), not on a request's unknown word
        # The package's own sentence splitting and clause cutting; its acoustic session is not used here.
        self._tts = Hibari(voice=VOICE, threads=1, g2p=g2p)
        self._piece = MAX_PHONEMES
        self._subtokens = SUBTOKEN_RE  # how the G2P splits a word, for `g2p_work`
        # The package's number reader names groups of three digits up to its last scale word (decillion) and
        # raises on a longer number: the only G2P failure found (tests/unit/stages/test_hibari.py).
        self.readable_digits = 3 * len(SCALES)
        # The ids that make no sound of their own: the pads, spaces and punctuation (pauses), intonation marks.
        self._pauses = frozenset({0} | {id for symbol, id in self._tts.vocab.items() if not symbol.isalpha()})
        self._lock = threading.Lock()

    def sentences(self, text: str) -> list[str]:
        """The package's sentences of `text`, after the checks of the whole text that come before any audio.

        InvalidRequest for a text that would hold the G2P longer than
        `G2P_BUDGET` allows, or one with a sentence the G2P cannot read: a
        sentence with a number longer than the package reads is read here,
        ahead, so that such a text is refused before its first sentence is
        handed on (any other sentence is read once, by `sentence_ids`).
        """
        work, word, word_work = g2p_work(text, self._subtokens)
        if work > G2P_BUDGET:
            shown = repr(word if len(word) <= 40 else word[:40] + "...")
            if word_work > G2P_BUDGET:
                raise InvalidRequest(
                    f"text has a word the voice cannot pronounce in reasonable time ({shown}: letters, symbols, "
                    "hyphens or slashes run together); put spaces in long runs of them",
                    code=TEXT_TOO_COMPLEX,
                    field="text",
                )
            raise InvalidRequest(
                f"text has too many words joined from many pieces (such as {shown}) to pronounce in reasonable "
                "time; split it into several requests",
                code=TEXT_TOO_COMPLEX,
                field="text",
            )
        sentences: list[str] = self._tts.split_sentences(text)
        for sentence in sentences:
            if longest_number(sentence) > self.readable_digits:
                self.sentence_ids(sentence)
        return sentences

    def sentence_ids(self, sentence: str) -> list[list[int]]:
        """One id list per chunk of one of `sentences`' sentences (with the 0 pads), chunks too short to speak
        dropped; InvalidRequest for a sentence the G2P cannot read."""
        with self._lock:  # the G2P is pure Python (the GIL serializes it anyway); one caller at a time
            try:
                chunks = self._tts.phonemize(sentence)
            except Exception as error:  # the package's G2P on text it has no rule for (a 40-digit number)
                number = longest_number_word(sentence)
                if sum(c.isdigit() for c in number) > self.readable_digits:  # the client's text, not a fault here
                    digits = sum(c.isdigit() for c in number)
                    shown = repr(number if len(number) <= 40 else number[:40] + "...")
                    log.info(
                        "refused a text with a number of %d digits (the G2P reads %d)", digits, self.readable_digits
                    )
                    raise InvalidRequest(
                        f"the voice's G2P cannot read this text: a number of {digits} digits ({shown}), and it reads "
                        f"numbers of at most {self.readable_digits}; write it in words, or in groups of digits "
                        "separated by spaces",
                        code=TEXT_UNREADABLE,
                        field="text",
                    ) from None
                log.warning("hibari's G2P failed on a request's text", exc_info=True)
                raise InvalidRequest(
                    f"the voice's G2P cannot read this text ({type(error).__name__}: {str(error)[:120]})",
                    code=TEXT_UNREADABLE,
                    field="text",
                ) from None
        cut = ["".join(piece) for chunk in chunks for piece in cut_long_chunk(chunk, MAX_CHUNK_PHONEMES, self._piece)]
        return [ids for ids in (self._tts.ids(ps) for ps in cut) if len(ids) >= 3]

    def silent(self, ids: list[int]) -> bool:
        """Whether a chunk's ids are pauses only (punctuation, spaces): "..." reads as 0.75 s of near-silence."""
        return all(id in self._pauses for id in ids)

    def phoneme_ids(self, text: str) -> list[list[int]]:
        """One id list per sentence chunk of the whole text: `sentence_ids` of each of its `sentences`.

        InvalidRequest for a text the G2P cannot read, or one that would hold it
        longer than `G2P_BUDGET` allows.
        """
        return [ids for sentence in self.sentences(text) for ids in self.sentence_ids(sentence)]


WARM_UP_PHONEMES = "ɐ sˈupəɹvˌIzəɹ dəsˈIdz wˌɛɹ ˈiʧ stˈAʤ ɹˈʌnz."
"""A short sentence ("A supervisor decides where each stage runs.") in the model's alphabet, run once at load."""


class Acoustic:
    """The acoustic ONNX model: phoneme ids -> spectral parameters and F0 for one sentence."""

    def __init__(self, threads: int) -> None:
        from hibari import Hibari

        self.threads = threads
        self._tts = Hibari(voice=VOICE, threads=threads)

    def warm_up(self) -> dict[str, np.ndarray]:
        """One pass on WARM_UP_PHONEMES: onnxruntime's first-run work (buffers, kernels) before any request."""
        return self.frames(self._tts.ids(WARM_UP_PHONEMES), 1.0)

    def frames(self, ids: list[int], speed: float) -> dict[str, np.ndarray]:
        """{lh, theta, ln, lr, phi: (601, F) float32, f0: (F,) float32}, as `Hibari.from_ids` feeds the DSP."""
        outputs = self._tts.sess.run(
            None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)}
        )
        return {name: out[0] for name, out in zip((*SPECTRAL_PARTS, "f0"), outputs, strict=True)}


def ort_threads() -> int:
    """The acoustic session's threads from STAGEVISOR_ORT_THREADS (default 1, as the package's); ValueError
    naming it if bad. The thread count changes the float results, so audio is bit-identical across topologies
    only when every worker uses the same value."""
    return threads_from_env(envs.ORT_THREADS, 1)


@functools.lru_cache(maxsize=1)
def load_phonemizer() -> Phonemizer:
    """The process's Phonemizer. Raises ImportError naming the `demo` extra when hibari is missing."""
    _require_extra()
    return Phonemizer()


@functools.lru_cache(maxsize=1)
def load_acoustic() -> Acoustic:
    """The process's acoustic model, run once (`Acoustic.warm_up`), so the first request waits for no first-run
    setup. Raises ImportError naming the `demo` extra when hibari is missing."""
    _require_extra()
    acoustic = Acoustic(ort_threads())
    started = time.perf_counter()
    acoustic.warm_up()
    log.info("hibari acoustic model warmed up in %.3fs", time.perf_counter() - started)
    return acoustic


def _require_extra() -> None:
    from stagevisor.stages.extras import missing_extras

    for missing in missing_extras([("voice", "stagevisor.stages.hibari.voice:load_acoustic")]):
        raise ImportError(missing.message())
