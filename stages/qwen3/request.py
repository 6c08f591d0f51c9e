"""A synthesis request read for a Qwen3-TTS checkpoint: what it asks for, checked against what the checkpoint can do.

Pure Python (no torch): every refusal is an InvalidRequest whose `code` names
the reason and whose `field` the request field at fault, raised before any model work, so a request a checkpoint cannot
serve costs nothing and says which checkpoint type would serve it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from stagevisor.stages.base import InvalidRequest
from stagevisor.stages.codes import INVALID_OPTION, TEXT_EMPTY, TEXT_TOO_LONG, UNKNOWN_OPTION
from stagevisor.stages.qwen3.checkpoint import Checkpoint
from stagevisor.supervisor.numbers import decimal, integer_text, plain

MAX_TEXT_CHARS = 2000
MAX_INSTRUCTION_CHARS = MAX_TEXT_CHARS
"""`instructions` may be as long as the text (docs/api/grpc.md), each in the talker's prompt."""
MAX_NEW_TOKENS_LIMIT = 4096
"""The most codec frames one request may ask for (about 5.5 minutes at 12.5 frames/s), or the checkpoint's own
default where that is more (8192 in the released ones): a request may always ask for what it gets unasked."""
MAX_SEED = 2**63 - 1
"""The largest seed a request may give (torch's generator takes it); models/qwen3.py declares it to the HTTP API."""
MIN_REFERENCE_SECONDS = 0.5
"""Shortest reference_audio a voice is cloned from, as the HTTP API's floor (supervisor/http/reference.py); gRPC
clients reach the stage unchecked, and the speaker encoder's padded convolutions fail on less than about 0.06 s."""
DEFAULT_VOICES = ("", "default")
REFERENCE_FIELDS = "reference_audio (HTTP: ref_audio; CLI: --reference-audio)"
TRANSCRIPT_FIELDS = "reference_transcript (HTTP: ref_text; CLI: --reference-transcript)"
"""The reference fields as refusals name them: the HTTP API's speech request names them otherwise than gRPC, and
`stagevisor synthesize`, `check` and `bench` take them as flags."""


@dataclass(frozen=True)
class Sampling:
    """Sampling for the talker (first codebook) and the code predictor (codebooks 1-15)."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048

    def generate_kwargs(self) -> dict[str, Any]:
        """The same settings as keyword arguments of the package's generate()."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class Unsupported(InvalidRequest):
    """The request asks for something this checkpoint cannot do (cloning, a preset speaker, instructions)."""

    code: str

    def __init__(self, code: str, message: str, field: str) -> None:
        # The code travels beside the text (StageError: gRPC's stagevisor-error-code, the HTTP error's `code`), so
        # the text does not repeat it; the field too (stagevisor-error-field, the HTTP error's `param`).
        super().__init__(message, code=code, field=field)


@dataclass(frozen=True)
class Qwen3Request:
    """One request, validated: what preprocessing builds the prompt from."""

    text: str
    language: str
    speaker: str | None
    instructions: str | None
    reference_audio: bytes | None
    reference_transcript: str | None
    seed: int | None
    sampling: Sampling

    @property
    def in_context(self) -> bool:
        """Cloning with the reference's codes and transcript (the package's ICL mode), not its speaker vector alone."""
        return self.reference_audio is not None and bool(self.reference_transcript)


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _whole(value: str) -> int:
    """An integer, also as a JSON client writes a number (`30.0`); ValueError for a fraction."""
    number = integer_text(value)
    if number is None:  # float()'s own message would name a float to a client who sent a seed
        raise ValueError(f"expected a whole number, got {value}")
    return number


def _ranged(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            parsed = kind(value)
        except ValueError as error:
            if kind is _whole:
                raise
            raise ValueError(f"expected a number, got {value}") from error
        if not low <= parsed <= high:
            raise ValueError(f"must be within [{plain(low)}, {plain(high)}], got {parsed}")
        return parsed

    return parse


def _temperature(value: str) -> float:
    """0, greedy decoding (only where that part does not sample: `_greedy_only`), or within [0.001, 10]."""
    parsed: float = _ranged(decimal, 0.0, 10.0)(value)
    if 0 < parsed < 1e-3:
        raise ValueError(f"must be 0 (greedy decoding) or within [0.001, 10], got {parsed}")
    return parsed


@dataclass(frozen=True)
class SamplingOption:
    """One sampling argument of the package's generate() as a request gives it: JSON type, bounds and meaning
    (declared to the HTTP API, which checks them and lists them at GET /v1/models)."""

    type: str
    """boolean, integer or number."""
    minimum: float | None = None
    maximum: float | None = None
    description: str = ""

    def parser(self) -> Callable[[str], Any]:
        if self.type == "boolean":
            return _bool
        assert self.minimum is not None and self.maximum is not None
        return _ranged(_whole if self.type == "integer" else decimal, self.minimum, self.maximum)


SAMPLING: dict[str, SamplingOption] = {
    "do_sample": SamplingOption("boolean", description="Sample the first codebook (false: greedy decoding)."),
    "top_k": SamplingOption("integer", 0, 100_000, "Keep the k likeliest first-codebook codes (0: all)."),
    "top_p": SamplingOption("number", 0.0, 1.0, "Keep the likeliest first-codebook codes up to this mass (1: all)."),
    "temperature": SamplingOption(
        "number", 0.0, 10.0, "The first codebook's temperature: at least 0.001, or 0 with do_sample false."
    ),
    "repetition_penalty": SamplingOption(
        "number", 1e-3, 10.0, "Penalty on first-codebook codes drawn before (1: none)."
    ),
    "subtalker_dosample": SamplingOption(
        "boolean", description="Sample codebooks 1-15 in the code predictor (false: greedy decoding)."
    ),
    "subtalker_top_k": SamplingOption("integer", 0, 100_000, "top_k for codebooks 1-15."),
    "subtalker_top_p": SamplingOption("number", 0.0, 1.0, "top_p for codebooks 1-15."),
    "subtalker_temperature": SamplingOption(
        "number", 0.0, 10.0, "temperature for codebooks 1-15: at least 0.001, or 0 with subtalker_dosample false."
    ),
    # At least 2: frame t's first code is drawn at step t and its other 15 at step t + 1, so n steps make n - 1 frames.
    "max_new_tokens": SamplingOption(
        "integer", 2, MAX_NEW_TOKENS_LIMIT, "Most talker steps: n make n - 1 frames of 80 ms, then the audio ends."
    ),
}
"""The sampling options; defaults from the checkpoint's generation_config.json (`sampling_defaults`)."""
SAMPLING_OPTIONS: dict[str, Callable[[str], Any]] = {
    **{name: option.parser() for name, option in SAMPLING.items()},
    "temperature": _temperature,
    "subtalker_temperature": _temperature,
}
OPTIONS = ("language", "seed", "instructions", *SAMPLING_OPTIONS)
SPEED_OPTIONS = ("speed", "length_scale")
"""A speaking rate, which Qwen3-TTS has no control for; the HTTP API sends the OpenAI `speed` as length_scale."""


def sampling_defaults(generate_config: Mapping[str, Any] | None) -> Sampling:
    """The checkpoint's generation_config.json over the package's own defaults (its rule for unset arguments).

    Each value is read as the same option of a request would be (a default may ask for more frames than a request
    may); ValueError names the one the sampling cannot take, which would otherwise fail every request.
    """
    if generate_config is not None and not isinstance(generate_config, Mapping):
        raise ValueError(f"generation_config.json holds {type(generate_config).__name__}, not a JSON object")
    chosen = {f.name: getattr(Sampling(), f.name) for f in fields(Sampling)}
    for name, value in (generate_config or {}).items():
        if name in chosen and value is not None:
            # A default may ask for more frames than a request may: it raises what a request may ask for.
            read = _ranged(_whole, 2, 2**31 - 1) if name == "max_new_tokens" else SAMPLING_OPTIONS[name]
            try:
                chosen[name] = read(str(value))
            except ValueError as error:
                raise ValueError(f"generation_config.json {name!r}: {error}") from None
    sampling = Sampling(**chosen)
    problem = _greedy_only(sampling)
    if problem:
        raise ValueError(f"generation_config.json {problem}")
    return sampling


def most_frames(defaults: Sampling) -> int:
    """The most max_new_tokens a request may ask for: MAX_NEW_TOKENS_LIMIT, or the checkpoint's default if more."""
    return max(MAX_NEW_TOKENS_LIMIT, defaults.max_new_tokens)


GREEDY_SWITCHES = (("do_sample", "temperature"), ("subtalker_dosample", "subtalker_temperature"))
"""Each part's sampling switch and its temperature, which may be 0 only where the switch is off."""


def _greedy_field(sampling: Sampling) -> str | None:
    """The temperature that is 0 where its part samples (it divides by it), or None."""
    for sample, temperature in GREEDY_SWITCHES:
        if getattr(sampling, sample) and getattr(sampling, temperature) == 0:
            return temperature
    return None


def _greedy_only(sampling: Sampling) -> str | None:
    """What is wrong with a temperature of 0 where that part samples (it divides by it), or None."""
    temperature = _greedy_field(sampling)
    if temperature is None:
        return None
    sample = dict((t, s) for s, t in GREEDY_SWITCHES)[temperature]
    return f"{temperature!r}: 0 is greedy decoding: set {sample!r} false for it, or give at least 0.001"


def _sampling(options: Mapping[str, str], defaults: Sampling) -> Sampling:
    chosen = {f.name: getattr(defaults, f.name) for f in fields(Sampling)}
    for name, parse in SAMPLING_OPTIONS.items():
        if name in options:
            read = _ranged(_whole, 2, most_frames(defaults)) if name == "max_new_tokens" else parse
            try:
                chosen[name] = read(str(options[name]))
            except ValueError as error:
                raise InvalidRequest(f"option {name!r}: {error}", code=INVALID_OPTION, field=name) from None
    sampling = Sampling(**chosen)
    problem = _greedy_only(sampling)
    if problem:
        raise InvalidRequest(f"option {problem}", code=INVALID_OPTION, field=_greedy_field(sampling))
    return sampling


def _text_field(request: Mapping[str, Any], options: Mapping[str, str], name: str) -> str | None:
    value = request.get(name) or options.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name!r} must be a string", code=INVALID_OPTION, field=name)
    # Blank is absent: a blank transcript would clone in context from a reference said to say nothing.
    return value if value.strip() else None


def _speaker(checkpoint: Checkpoint, voice: str) -> str | None:
    wanted = voice.strip().lower()
    if not checkpoint.has_speakers:
        if wanted in DEFAULT_VOICES:
            return None
        hint = f"clone a voice with {REFERENCE_FIELDS}" if checkpoint.clones else "describe the voice in `instructions`"
        raise Unsupported(
            "QWEN3_NO_PRESET_SPEAKERS",
            f"this {checkpoint.kind_name} checkpoint has no preset speakers (voice {voice!r}); {hint}, or serve a "
            "CustomVoice checkpoint",
            "voice",
        )
    if wanted in DEFAULT_VOICES:
        return checkpoint.speakers[0]
    if voice.strip() in checkpoint.speakers:
        return voice.strip()
    # Else any case, answered with the config's own spelling: the prompt looks the speaker up in spk_id and
    # spk_is_dialect by it. The released checkpoints' names are lower case; a fine-tune's is as its trainer gave
    # it (`sft_12hz.py --speaker_name Alice`), and GET /v1/audio/voices lists it so.
    spelled = {name.lower(): name for name in reversed(checkpoint.speakers)}
    if wanted not in spelled:
        raise Unsupported(
            "QWEN3_UNKNOWN_SPEAKER",
            f"unknown voice {voice!r}; this checkpoint's speakers: {', '.join(checkpoint.speakers)}",
            "voice",
        )
    return spelled[wanted]


NEEDS_REFERENCE = (
    f"this Base checkpoint speaks only in a cloned voice: give {REFERENCE_FIELDS}, a WAV file, and, for the closest "
    f"clone, its {TRANSCRIPT_FIELDS}"
)


def listed_voices(checkpoint: Checkpoint, sample_rate: int) -> list[dict[str, Any]]:
    """What GET /v1/audio/voices lists of the checkpoint: its preset speakers (CustomVoice), else its one unnamed
    voice, which a Base checkpoint cannot speak in alone (every request needs reference audio): listed as not
    usable, saying why, as its requests are refused (QWEN3_NEEDS_REFERENCE)."""
    if checkpoint.has_speakers:
        return [{"id": name, "name": name, "sample_rate": sample_rate} for name in checkpoint.speakers]
    voice: dict[str, Any] = {"id": "default", "name": "default", "sample_rate": sample_rate}
    if checkpoint.clones:
        voice.update(usable=False, unusable_reason=NEEDS_REFERENCE)
    return [voice]


def parse(request: Mapping[str, Any], checkpoint: Checkpoint, defaults: Sampling) -> Qwen3Request:
    """Read one request and check it against the checkpoint; InvalidRequest (coded when unsupported) if unservable."""
    options = request.get("options") or {}
    speed = next((name for name in SPEED_OPTIONS if name in options), None)
    if speed is not None:
        raise Unsupported(
            "QWEN3_NO_SPEED",
            "Qwen3-TTS has no speaking-rate control: leave out `speed` (over HTTP, 1.0 is the same), or ask for a "
            "pace in `instructions` on a checkpoint that follows them",
            speed,
        )
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidRequest(
            f"unknown option(s) {unknown} for Qwen3-TTS; accepted: {', '.join(OPTIONS)}",
            code=UNKNOWN_OPTION,
            field=unknown[0],
        )
    text = request.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InvalidRequest("text is empty; give the text to speak", code=TEXT_EMPTY, field="text")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequest(
            f"text is {len(text)} characters; at most {MAX_TEXT_CHARS} are accepted", code=TEXT_TOO_LONG, field="text"
        )
    language = (_text_field(request, options, "language") or "auto").strip().lower()
    if language not in checkpoint.languages:
        raise Unsupported(
            "QWEN3_UNKNOWN_LANGUAGE",
            f"unsupported language {language!r}; this checkpoint speaks: {', '.join(checkpoint.languages)}",
            "language",
        )
    instructions = _text_field(request, options, "instructions")
    if instructions is not None:
        if not checkpoint.follows_instructions:
            raise Unsupported(
                "QWEN3_NO_INSTRUCTIONS",
                f"this {checkpoint.kind_name} checkpoint (size {checkpoint.size or '?'}) does not follow "
                "`instructions`; serve a VoiceDesign or a 1.7B CustomVoice checkpoint",
                "instructions",
            )
        if len(instructions) > MAX_INSTRUCTION_CHARS:
            raise InvalidRequest(
                f"instructions has {len(instructions)} characters; at most {MAX_INSTRUCTION_CHARS}, as the text",
                code=INVALID_OPTION,
                field="instructions",
            )
    reference = request.get("reference_audio") or None
    transcript = _text_field(request, options, "reference_transcript")
    if reference is not None and not checkpoint.clones:
        raise Unsupported(
            "QWEN3_NO_CLONING",
            f"this {checkpoint.kind_name} checkpoint cannot clone a voice from reference_audio; "
            "serve a Base checkpoint",
            "reference_audio",
        )
    if checkpoint.clones and reference is None:
        raise Unsupported("QWEN3_NEEDS_REFERENCE", NEEDS_REFERENCE, "reference_audio")
    if transcript is not None and reference is None:  # only a checkpoint that cannot clone gets here (see above)
        raise Unsupported(
            "QWEN3_NO_CLONING",
            f"this {checkpoint.kind_name} checkpoint cannot clone a voice, so it takes no reference_transcript "
            "(the transcript of a reference_audio): drop it, or serve a Base checkpoint",
            "reference_transcript",
        )
    seed = request.get("seed") if request.get("seed") is not None else options.get("seed")
    try:
        seed_value = None if seed is None else _ranged(_whole, 0, MAX_SEED)(str(seed))
    except ValueError as error:
        raise InvalidRequest(f"option 'seed': {error}", code=INVALID_OPTION, field="seed") from None
    return Qwen3Request(
        text=text,
        language=language,
        speaker=_speaker(checkpoint, str(request.get("voice") or "")),
        instructions=instructions,
        reference_audio=bytes(reference) if reference is not None else None,
        reference_transcript=transcript,
        seed=seed_value,
        sampling=_sampling(options, defaults),
    )
