"""A speech request's body, checked: OpenAI's fields, stagevisor's additions and model options, errors naming the field.

The same checks serve POST /v1/audio/speech, every item of the batch
endpoint, the WebSocket's start message and the plain GET: each builds a
dict of fields and calls `parse_speech_request` against what the daemon
serves (`Served`: its names, voices, uploaded voices and what the model takes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from stagevisor.supervisor.config import SpeechConfig
from stagevisor.supervisor.dataplane.limits import check_unicode, quote
from stagevisor.supervisor.dataplane.synthesis import MAX_TEXT_CHARS, validate_request
from stagevisor.supervisor.dataplane.limits import CONTROL_CHARACTER, InvalidSynthesisRequest
from stagevisor.supervisor.http.audio import FORMATS
from stagevisor.supervisor.errors import shown
from stagevisor.supervisor.http.errors import HTTP_PARAM, ApiError
from stagevisor.supervisor.http.fields import choice_field, given_fields, json_type, number_field, string_field
from stagevisor.supervisor.config.voices import declared_names, declared_spelling
from stagevisor.supervisor.http.names import PCM_SAMPLE_RATE
from stagevisor.supervisor.http.options import model_options
from stagevisor.supervisor.http.reference import BadReference, decode_base64_audio, normalize_reference
from stagevisor.supervisor.http.voices import StoredVoice, UnreadableVoice
from stagevisor.models.registry import names_hub_id

SPEED_RANGE = (0.25, 4.0)
SAMPLE_RATE_RANGE = (8000, 48000)
STREAM_FORMATS = ("audio", "sse")


@dataclass
class SpeechRequest:
    """A validated speech request."""

    model: str
    input: str
    voice: str = ""
    """The model's voice id (after the name map); "" for the model's default."""
    instructions: str = ""
    response_format: str = "mp3"
    speed: float | None = None
    stream_format: str = "audio"
    sample_rate: int | None = None
    """The rate of the audio sent; None: the model's own rate."""
    language: str = ""
    seed: int | None = None
    reference_audio: bytes = b""
    """16-bit mono WAV: from `ref_audio` or an uploaded voice."""
    reference_text: str = ""
    options: dict[str, str] = field(default_factory=dict)
    """Model options: the extra fields (e.g. noise_scale) as strings, plus length_scale from speed."""


@dataclass(frozen=True)
class Served:
    """What a request is checked against: the names, voices and features of the served model."""

    models: tuple[str, ...]
    """The names GET /v1/models lists, each accepted as `model`."""
    unlisted_models: tuple[str, ...] = ()
    """Names accepted as `model` that are listed nowhere (--model-path as a local directory)."""
    hub_id: str | None = None
    """The model's hub id --model-path names (listed in `models`): taken in any case."""
    voices: list[dict[str, Any]] = field(default_factory=list)
    """The voices the model declares (each with `id`, maybe `aliases`)."""
    voice_map: Mapping[str, str] = field(default_factory=dict)
    """Other names clients send -> the model's voice (OpenAI's names, the config's `voices`)."""
    uploaded: Callable[[str], StoredVoice | UnreadableVoice | None] = lambda name: None
    """The uploaded voice of a name, or the entry holding it that cannot be read as one; None: no such entry."""
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    sample_rate: int | None = None
    """--sample-rate: the rate of every format when a request gives none."""


def answers_to(model: str, served: Served) -> bool:
    """Whether a request's `model` names the served model: a name it is listed or accepted under, or its hub id in
    any case (`qwen/qwen3-tts-12hz-1.7b-base`, as --model-path matches it)."""
    if model in served.models or model in served.unlisted_models:
        return True
    return served.hub_id is not None and names_hub_id(model, (served.hub_id,))


def parse_speech_request(data: Mapping[str, Any], served: Served) -> SpeechRequest:
    """Validate a request's fields against what is served; ApiError (400/404) names the field."""
    data = given_fields(data)
    model = string_field(data, "model")
    if not answers_to(model, served):
        raise ApiError(
            404,
            f"model {quote(model)} is not served here; this daemon serves {', '.join(map(repr, served.models))}",
            param="model",
            code="model_not_found",
        )
    text = string_field(data, "input")
    instructions = string_field(data, "instructions", "")
    if len(instructions) > MAX_TEXT_CHARS:
        raise ApiError(
            400,
            f"'instructions' has {len(instructions)} characters; the limit is {MAX_TEXT_CHARS}",
            param="instructions",
            code="invalid_value",
        )
    control = CONTROL_CHARACTER.search(instructions)
    if control:  # said as the input's is (dataplane/limits.py): which character, and where
        raise ApiError(
            400,
            f"'instructions' contains the control character {control.group()!r} at position {control.start()}; "
            "remove it",
            param="instructions",
            code="invalid_value",
        )
    try:
        check_unicode("instructions", instructions)
    except InvalidSynthesisRequest as error:
        raise ApiError(400, str(error), param="instructions", code="invalid_value") from None
    response_format = choice_field(data, "response_format", "mp3", FORMATS)
    stream_format = choice_field(data, "stream_format", "audio", STREAM_FORMATS)
    speed = _speed(data, served.speech)
    sample_rate = number_field(data, "sample_rate", *SAMPLE_RATE_RANGE, integer=True)
    if sample_rate is None:
        sample_rate = served.sample_rate or (PCM_SAMPLE_RATE if response_format == "pcm" else None)
    request = SpeechRequest(
        model=model,
        input=text,
        instructions=instructions,
        response_format=response_format,
        stream_format=stream_format,
        speed=None if speed is None else float(speed),
        sample_rate=sample_rate,
        language=_language(data, served.speech),
        seed=_seed(data, served.speech),
        options=model_options(data, served.speech.options),
    )
    _voice_and_reference(data, served, request)
    if speed is not None and float(speed) != 1.0:
        speed_option = "speed" if served.speech.options and "speed" in served.speech.options else "length_scale"
        if speed_option in request.options and speed_option != "speed":
            raise ApiError(400, "give either 'speed' or 'length_scale', not both", param="speed", code="invalid_value")
        request.options[speed_option] = repr(float(speed)) if speed_option == "speed" else repr(1.0 / float(speed))
    return request


def _speed(data: Mapping[str, Any], speech: SpeechConfig) -> Any:
    """The request's `speed` (None when not given); a model without a speaking rate takes only 1, which changes
    nothing, and refuses any other here rather than in its stages, with `param` naming the field."""
    speed = number_field(data, "speed", *SPEED_RANGE)
    if speed is not None and float(speed) != 1.0 and not speech.speed:
        raise ApiError(
            400,
            f"speed {shown(speed)} is not supported: this model has no speaking-rate control (GET /v1/models: "
            "accepts.speed is false); leave out 'speed' or send 1",
            param="speed",
            code="invalid_value",
        )
    return speed


def _language(data: Mapping[str, Any], speech: SpeechConfig) -> str:
    language = string_field(data, "language", "")
    # Case-insensitive, as the stages read it (Qwen's own examples write "English"); the declared spelling is sent.
    declared = {name.casefold(): name for name in speech.languages}
    language = declared.get(language.casefold(), language)
    if language and language not in speech.languages:
        # A model that lists no languages takes no `language` at all, as one without a seed takes no `seed`.
        code = "invalid_value" if speech.languages else "unsupported"
        raise ApiError(400, _language_refusal(language, speech.languages), param="language", code=code)
    return language


def _language_refusal(language: str, languages: tuple[str, ...]) -> str:
    """Why `language` is refused by a model that lists `languages`: one that lists none takes no `language`."""
    if not languages:
        return (
            "this model takes no 'language': it lists no languages to choose from (GET /v1/models lists what it "
            "takes); drop the field"
        )
    if len(languages) == 1:
        return f"language {quote(language)} is not one this model speaks: it speaks only {languages[0]}"
    return f"language {quote(language)} is not one this model speaks; use one of {', '.join(languages)}"


def _seed(data: Mapping[str, Any], speech: SpeechConfig) -> int | None:
    seed = number_field(data, "seed", 0, speech.seed_maximum, integer=True)  # the model's range, as its stages check
    if seed is not None and not speech.seed:
        raise ApiError(
            400, "this model takes no 'seed' (GET /v1/models lists what it takes)", param="seed", code="unsupported"
        )
    return seed


def requested_voice(data: Mapping[str, Any]) -> Any:
    """The request's `voice` as given ("" when absent), OpenAI's custom-voice form `{"id": "..."}` read as its id."""
    value = data.get("voice", "")
    if isinstance(value, dict) and set(value) == {"id"}:
        return value["id"]
    return value


def _voice_and_reference(data: Mapping[str, Any], served: Served, request: SpeechRequest) -> None:
    """Set the request's voice, or its reference from an uploaded voice or `ref_audio`."""
    value = requested_voice(data)
    if not isinstance(value, str):
        raise ApiError(400, _voice_type_problem(data.get("voice")), param="voice", code="invalid_type")
    name = value.strip()
    model_voice = _model_voice(name, served)
    uploaded = served.uploaded(name) if model_voice is None else None
    if model_voice is not None:
        request.voice = model_voice
    elif uploaded is not None:
        if not served.speech.clones:
            raise ApiError(
                400,
                f"voice {quote(name)} is an uploaded voice, and this model cannot clone a voice from reference audio; "
                "use one of its own voices (GET /v1/audio/voices)",
                param="voice",
                code="cloning_not_supported",
            )
        # Listed as not usable, saying why (voices.voice_listing): a request naming it says the same, where it
        # was told the voice did not exist, or failed on a `ref_audio` or `ref_text` the client never sent.
        why = uploaded.reason if isinstance(uploaded, UnreadableVoice) else uploaded.problem and uploaded.stale_reason
        if why:
            raise ApiError(
                400, f"uploaded voice {quote(name)} cannot be used: {why}", param="voice", code="voice_not_usable"
            )
        assert isinstance(uploaded, StoredVoice)
        request.reference_audio, request.reference_text = uploaded.audio, uploaded.transcript
    elif served.voices:
        known = ", ".join(repr(v["id"]) for v in served.voices)
        target = served.voice_map.get(name)
        mapped = (
            f" (it stands for {quote(target)} in the config's `voices`, which the model does not have: the "
            "operator should fix that entry)"
            if target is not None
            else ""
        )
        raise ApiError(
            400,
            f"voice {quote(name)} is not available{mapped}; voices: {known} and the names GET /v1/audio/voices lists",
            param="voice",
            code="voice_not_found",
        )
    else:
        request.voice = name  # the model declares no voices: its stages judge the name
    _reference(data, served, request, from_upload=uploaded is not None)


def _voice_type_problem(given: Any) -> str:
    """Why `voice` is neither a string nor OpenAI's `{"id": string}`: an object is told what is wrong in it."""
    if not isinstance(given, dict):
        return f"'voice' must be a string or {{\"id\": string}}, got {json_type(given)}"
    if set(given) != {"id"}:
        keys = ", ".join(shown(key) for key in given)
        found = f"it has the keys {keys}" if keys else "it is empty"
        return f"'voice' as an object is OpenAI's {{\"id\": string}} and has no other key; {found}"
    return f"'voice' as an object is OpenAI's {{\"id\": string}}; its 'id' is {json_type(given['id'])}"


def _model_voice(name: str, served: Served) -> str | None:
    """The model's voice `name` asks for; None when it names none (only then may it be an uploaded voice).

    In order: no name (the model's default, ""), one of the model's names as
    written, a name mapped onto one, then one of the model's names in another
    case. Uploaded voices come after all of these, so none takes their
    requests: not one named in another case (`HEART` beside `heart`), nor one
    stored before the model or the map came to use its name. POST
    /v1/audio/voices refuses such names (voices.TakenNames).
    """
    declared = declared_names(served.voices)
    if not name or name in declared:
        return name
    if name in served.voice_map and (not served.voices or served.voice_map[name] in declared):
        return served.voice_map[name]
    spelled = declared_spelling(name, declared)  # "Vivian", as Qwen's docs name the speaker `vivian`
    return spelled if spelled in declared else None


def _reference(data: Mapping[str, Any], served: Served, request: SpeechRequest, *, from_upload: bool) -> None:
    ref_audio = data.get("ref_audio")
    ref_text = string_field(data, "ref_text", "")
    if ref_audio is None:
        if ref_text and not from_upload:
            raise ApiError(
                400, "'ref_text' needs 'ref_audio' (the audio it transcribes)", param="ref_text", code="invalid_value"
            )
        if ref_text:
            request.reference_text = ref_text
        return
    if from_upload:
        raise ApiError(
            400, "give either an uploaded voice or 'ref_audio', not both", param="ref_audio", code="invalid_value"
        )
    if not isinstance(ref_audio, str):
        raise ApiError(
            400,
            f"'ref_audio' must be a base64 string or data URL, got {json_type(ref_audio)}",
            param="ref_audio",
            code="invalid_type",
        )
    if not served.speech.clones:
        raise ApiError(
            400,
            "this model cannot clone a voice from reference audio; drop 'ref_audio' or serve a model that clones",
            param="ref_audio",
            code="cloning_not_supported",
        )
    try:
        request.reference_audio, _ = normalize_reference(decode_base64_audio(ref_audio))
    except BadReference as error:
        raise ApiError(400, f"ref_audio: {error}", param="ref_audio", code=error.code) from None
    request.reference_text = ref_text


def to_payload(speech: SpeechRequest, max_text_chars: int = MAX_TEXT_CHARS) -> dict[str, Any]:
    """The pipeline request: the gRPC service's checks, plus the fields executors may use."""
    try:
        payload = validate_request(
            speech.input,
            voice=speech.voice,
            reference_audio=speech.reference_audio,
            reference_transcript=speech.reference_text,
            options=speech.options,
            max_text_chars=max_text_chars,
        )
    except InvalidSynthesisRequest as error:
        message = str(error)
        param = HTTP_PARAM.get(error.field, error.field) or None
        raise ApiError(
            400,
            message.replace("text ", "input ", 1) if param == "input" else message,
            param=param,
            code="invalid_value",
        ) from None
    if speech.instructions:
        payload["instructions"] = speech.instructions
    if speech.language:
        payload["language"] = speech.language
    if speech.seed is not None:
        payload["seed"] = speech.seed
    return payload
