"""The preprocessing stage the built-in voices share: validate, phonemize off the loop, hand the phonemes on.

A voice (stages/hibari, stages/piper) subclasses both classes with its own
options type: `PreparedPhonemes.options_from_data` reads its options back from
a payload, and `PhonemePreprocessing` supplies `check_voice`, `read_options` and
`phonemize` (and `sentences`, where a voice reads its text a sentence at a
time). The order of the checks is the contract its tests hold: text, then
voice, then options, then (off the event loop) phonemes, then whatever
`conditioning` adds (the stand-ins' reference audio), so a bad option is
reported before a bad reference. A voice that cannot clone (`clones` False:
hibari, Piper) refuses a request carrying reference audio there, rather than
speaking it in its own voice as if the reference had been used. `publish` is where the prepared request
goes (the payload's data by default; the stand-ins keep it process-local).

The phonemes are streamed a piece at a time, so an engine behind a `stream_to`
edge starts on the first sentence, and handed on whole as the stage's data.
Every refusal the voice can make from the whole text (`sentences`), nothing
speakable and a bad reference come before the first piece, so before any
audio; only a later piece the G2P fails on, which no built-in voice is known
to do, would end a request after its first audio (INVALID_ARGUMENT).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, Sequence, TypeVar

from stagevisor.stages.base import NOTHING_SPEAKABLE, InvalidRequest, StageContext, StageError, StagePayload
from stagevisor.stages.codes import CLONING_NOT_SUPPORTED
from stagevisor.stages.text import MAX_TEXT_CHARS, validate_text


class Options(Protocol):
    """A voice's validated synthesis options, as they travel in a payload."""

    def as_dict(self) -> dict[str, Any]: ...


OptionsT = TypeVar("OptionsT", bound=Options)
PreparedT = TypeVar("PreparedT", bound="PreparedPhonemes[Any]")


@dataclass
class PreparedPhonemes(Generic[OptionsT]):
    """What preprocessing hands the engine: phoneme ids per sentence (chunk) and validated options."""

    phoneme_ids: list[list[int]]
    options: OptionsT
    extras: dict[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {"phoneme_ids": self.phoneme_ids, "options": self.options.as_dict(), **self.extras}

    @classmethod
    def options_from_data(cls, data: Any) -> OptionsT:
        """The voice's options from their `as_dict()` form; KeyError, TypeError or ValueError when malformed."""
        raise NotImplementedError(f"{cls.__name__} must say how its options are read back")

    @classmethod
    def from_data(cls: type[PreparedT], data: dict[str, Any], stage: str) -> PreparedT:
        try:
            ids = [[int(i) for i in sentence] for sentence in data["phoneme_ids"]]
            options = cls.options_from_data(data["options"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StageError(
                f"stage {stage!r} received no prepared request (phoneme_ids, options) in its payload: {exc!r}; "
                "its upstream must be a preprocessing stage"
            ) from None
        extras = {k: v for k, v in data.items() if k not in ("phoneme_ids", "options")}
        return cls(ids, options, extras)


class PhonemePreprocessing(ABC, Generic[OptionsT]):
    """Validates the request and turns its text into phoneme ids; the first stage of every built-in model."""

    stage = "preprocessing"
    max_text_chars = MAX_TEXT_CHARS
    """Declared to the gateway (stages/base.py), which refuses longer texts before this stage runs."""
    prepared: type[PreparedPhonemes[OptionsT]] = PreparedPhonemes
    """The voice's PreparedPhonemes class."""
    clones = False
    """Whether a request's reference audio is used (by `conditioning`, or by a stage after this one)."""

    @abstractmethod
    def check_voice(self, requested: Any) -> None:
        """InvalidRequest unless `requested` (the request's `voice`, None when absent) is a voice this stage has."""

    @abstractmethod
    def read_options(self, request: dict[str, Any]) -> OptionsT:
        """The request's validated options; InvalidRequest naming a bad one."""

    @abstractmethod
    def phonemize(self, text: str) -> list[list[int]]:
        """A piece of `sentences` -> phoneme ids, one list per sentence (chunk); empty when nothing is speakable.
        Runs off the loop."""

    def silent(self, ids: list[int]) -> bool:
        """Whether a chunk's phoneme ids make no sound (pauses only). A text whose every chunk is silent is refused
        as nothing speakable; here no chunk is."""
        return False

    def sentences(self, text: str) -> list[str]:
        """`text` in the pieces `phonemize` takes one at a time, in order, once every check of the whole text
        that must come before any audio has passed (InvalidRequest otherwise). Runs off the loop.

        Here the whole text is one piece; a voice whose phonemes per sentence are
        those of the whole text returns its sentences, and the engine starts on
        the first while the rest are read.
        """
        return [text]

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict[str, Any] | None:
        text = validate_text(payload.request, self.max_text_chars)
        self.check_voice(payload.request.get("voice"))
        options = self.read_options(payload.request)
        phoneme_ids: list[list[int]] = []
        held: list[list[int]] = []  # silent chunks before the first that sounds: refused with the text if none does
        extras: dict[str, Any] | None = None
        # Each piece's ids are streamed as soon as they exist, so an engine behind a stream_to edge starts on the
        # first sentence while the G2P reads the next (the stream's window keeps the G2P a few sentences ahead at
        # most, and a cancelled request reads no further). Every refusal comes before the first chunk, so before
        # any audio: those that need the whole text (`sentences`), nothing speakable, a bad reference.
        for piece in await asyncio.to_thread(self.sentences, text):
            if ctx.cancelled:
                break
            ids = await asyncio.to_thread(self.phonemize, piece)
            if not phoneme_ids and all(self.silent(chunk) for chunk in ids):
                held += ids
                continue
            if extras is None:  # after text and options: a bad option is reported before a bad reference
                extras = await asyncio.to_thread(self.conditioning, payload.request)
            ids, held = held + ids, []
            phoneme_ids += ids
            await ctx.stream(self.prepared(ids, options, extras).to_data())
        if not phoneme_ids and not ctx.cancelled:
            raise InvalidRequest(
                f"text {text[:40]!r} has nothing speakable: it phonemizes to no sounds (punctuation or symbols alone, "
                "or a script the voice has no sounds for); give words the voice reads",
                code=NOTHING_SPEAKABLE,
                field="text",
            )
        # All of it as the payload's data too: an engine behind a plain `next` edge (the stand-ins, a pipeline
        # declared so) takes it whole, as before the pieces were streamed.
        return self.publish(payload, self.prepared(phoneme_ids, options, extras or {}))

    def conditioning(self, request: dict[str, Any]) -> dict[str, Any]:
        """Extra prepared state from the request (stand-ins encode the reference audio here); runs off the loop.

        Here, for a voice that does not clone: InvalidRequest when the request carries reference audio."""
        if request.get("reference_audio") and not self.clones:
            raise InvalidRequest(
                "this model speaks only its own voices and cannot clone a voice from reference audio; "
                "drop reference_audio, or serve a model that clones",
                code=CLONING_NOT_SUPPORTED,
                field="reference_audio",
            )
        return {}

    def publish(self, payload: StagePayload, prepared: PreparedPhonemes[OptionsT]) -> dict[str, Any]:
        """Hand the prepared request on; the built-in voices carry it in the payload's data."""
        return prepared.to_data()


def cut_long_chunk(phonemes: Sequence[str], max_chunk: int, piece: int) -> list[list[str]]:
    """`phonemes` (one symbol per item) whole when at most `max_chunk` long, else cut at " " symbols (a word longer
    than `piece` cut anywhere) into chunks of at most `piece` symbols, without their spaces at the cuts.

    A voice's acoustic model takes a chunk whole, in time and memory that grow
    faster than its length, and the voices' own sentence splitting leaves
    unpunctuated text in one chunk of any length: a server cuts it.
    """
    if len(phonemes) <= max_chunk:
        return [list(phonemes)]
    words: list[list[str]] = [[]]
    for symbol in phonemes:
        if symbol == " ":
            words.append([])
        else:
            words[-1].append(symbol)
    chunks: list[list[str]] = []
    current: list[str] = []
    for word in (w for w in words if w):
        while len(word) > piece:
            if current:
                chunks.append(current)
                current = []
            chunks.append(word[:piece])
            word = word[piece:]
        if current and len(current) + 1 + len(word) > piece:
            chunks.append(current)
            current = list(word)
        else:
            current = [*current, " ", *word] if current else list(word)
    if current:
        chunks.append(current)
    return chunks
