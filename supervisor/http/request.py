"""A speech request's body, checked: OpenAI's fields, stagevisor's additions and model options, errors naming the field.

The same checks serve POST /v1/audio/speech, every item of the batch
endpoint, the WebSocket's start message and the plain GET: each builds a
dict of fields and calls `parse_speech_request` against what the daemon
serves (`Served`: its names, voices, uploaded voices and what the model takes).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from starlette.requests import Request

from stagevisor.supervisor.config import OptionSpec, SpeechConfig
from stagevisor.supervisor.dataplane.limits import check_unicode, quote
from stagevisor.supervisor.dataplane.synthesis import (
    CONTROL_CHARACTER,
    MAX_TEXT_CHARS,
    OPTION_KEY,
    InvalidSynthesisRequest,
    validate_request,
)
from stagevisor.supervisor.http.audio import FORMATS
from stagevisor.supervisor.http.errors import ApiError
from stagevisor.supervisor.http.names import PCM_SAMPLE_RATE, declared_names, declared_spelling
from stagevisor.supervisor.http.reference import BadReference, decode_base64_audio, normalize_reference
from stagevisor.supervisor.http.voices import StoredVoice
from stagevisor.models.registry import names_hub_id
from stagevisor.supervisor.errors import shown
from stagevisor.supervisor.numbers import plain, whole_number

HTTP_PARAM = {"text": "input", "reference_transcript": "ref_text", "reference_audio": "ref_audio"}
"""The HTTP name of a service-level check's field (InvalidSynthesisRequest.field); `voice` and an option's key
keep theirs."""
MAX_BODY_BYTES = 6 * 1024 * 1024
"""Largest JSON body: the longest input plus a base64 `ref_audio` (4 MiB for a 3 MiB file) fit in it."""
SPEED_RANGE = (0.25, 4.0)
SAMPLE_RATE_RANGE = (8000, 48000)
FIELDS = (
    "model",
    "input",
    "voice",
    "instructions",
    "response_format",
    "speed",
    "stream_format",
    "sample_rate",
    "language",
    "seed",
    "ref_audio",
    "ref_text",
)
"""Fields with a meaning here; any other field is a model option (e.g. noise_scale)."""


def accepted_fields(speech: SpeechConfig) -> list[str]:
    """The FIELDS a request to a model of `speech` may carry without a 400 for being there (GET /v1/models):
    reference audio only where it clones, `seed` where it takes one, `language` where it lists languages.
    `instructions` stays: a model that does not follow them ignores or refuses them (`accepts.instructions`)."""
    refused = set()
    if not speech.clones:
        refused |= {"ref_audio", "ref_text"}
    if not speech.seed:
        refused.add("seed")
    if not speech.languages:
        refused.add("language")
    return [field for field in FIELDS if field not in refused]


REQUIRED_FIELDS = ("model", "input")
"""The fields a request must give; null on any other field is that field left out (its default)."""
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
    uploaded: Callable[[str], StoredVoice | None] = lambda name: None
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    sample_rate: int | None = None
    """--sample-rate: the rate of every format when a request gives none."""


async def read_json_body(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object; ApiError 415 (content type or a content encoding), 413 (too large) or 400 (not a
    JSON object)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            415, f"Content-Type must be application/json, got {media_type or 'none'!r}", code="unsupported_media_type"
        )
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):  # a compressed body would read as JSON that does not decode
        raise ApiError(
            415,
            f"Content-Encoding {encoding!r} is not accepted: send the JSON body uncompressed",
            code="unsupported_media_type",
        )
    declared = request.headers.get("content-length")
    size = None if declared is None else whole_number(declared)
    if size is not None and size > limit:
        raise ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="request_too_large")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    return parse_json_object(bytes(body))


class _Untakeable(ValueError):
    """JSON the parser cannot take: `str(error)` says why, after what was parsed (`the body`, `a message`)."""


def parse_json_object(body: bytes | str, what: str = "the body") -> dict[str, Any]:
    """A JSON object from text; ApiError 400 otherwise (NaN and Infinity are not JSON), its message naming the text
    as `what`."""
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_int=_integer, object_pairs_hook=_unique_keys)
    except _Untakeable as error:
        raise ApiError(400, f"{what} {error}", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, f"{what} nests arrays or objects too deeply", code="invalid_json") from None
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ApiError(400, f"{what} is not valid JSON: {error}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"{what} must be a JSON object, got {type(data).__name__}", code="invalid_json")
    return data


def _integer(text: str) -> int:
    # Python refuses to convert more digits than this (a guard against quadratic int parsing); its error
    # tells the client to call sys.set_int_max_str_digits().
    digits = len(text.lstrip("-"))
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()  # 0: no limit (and before Python 3.10.7)
    if limit and digits > limit:
        raise _Untakeable(f"holds an integer of {digits} digits; no field takes one that long")
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys each come once: a key given twice is refused, as a query parameter given twice is (the
    JSON parser would keep the last silently, and another parser the first)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Untakeable(f"gives {shown(key)} twice; give each field once")
        seen.add(key)
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def given_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a request gives: null on an optional field is that field not given (its default), as in
    OpenAI's API, whose SDKs and other clients send explicit nulls; null on a required field stays, to be
    refused as missing."""
    return {key: value for key, value in data.items() if value is not None or key in REQUIRED_FIELDS}


def _string(data: Mapping[str, Any], name: str, default: str | None = None) -> str:
    value = data.get(name, default)
    if value is None:
        raise ApiError(400, f"'{name}' is required", param=name, code="missing_required_parameter")
    if not isinstance(value, str):
        raise ApiError(400, f"'{name}' must be a string, got {json_type(value)}", param=name, code="invalid_type")
    return value


def json_type(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _choice(data: Mapping[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _string(data, name, default)
    if value not in choices:
        raise ApiError(
            400,
            f"{name} {quote(value)} is not supported; use one of {', '.join(choices)}",
            param=name,
            code="invalid_value",
        )
    return value


def integral(value: Any) -> bool:
    """Whether a JSON value is an integer: an int, or a float with no fraction (`30.0`, as JavaScript and many
    JSON encoders write a whole number they hold as a float). gRPC's options are strings, and the stages read
    "30.0" as 30 too (`numbers.integer_text`); a bool is no integer."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())


def _number(data: Mapping[str, Any], name: str, low: float, high: float, *, integer: bool = False) -> Any:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, float) and math.isinf(value):  # 1e400 in the JSON: no integer either, but say why
        raise ApiError(400, _out_of_range(name, value, plain(low), plain(high)), param=name, code="invalid_value")
    if isinstance(value, bool) or not (integral(value) if integer else isinstance(value, (int, float))):
        what = "an integer" if integer else "a number"
        raise ApiError(400, f"'{name}' must be {what}, got {json_type(value)}", param=name, code="invalid_type")
    if not low <= value <= high:
        raise ApiError(
            400,
            _out_of_range(name, value, plain(low), plain(high)),
            param=name,
            code="invalid_value",
        )
    return int(value) if integer else value


def _out_of_range(name: str, value: float, low: str, high: str) -> str:
    """Why `value` is refused for `name`. JSON has no infinity: an infinite float is a number the client wrote
    past what a 64-bit float holds (1e400, read as inf), so the message says that rather than show `inf`."""
    if isinstance(value, float) and math.isinf(value):
        return (
            f"{name} must be a finite number (it is past 1.8e308, the most a 64-bit float holds); use {low} to {high}"
        )
    return f"{name} {shown(value)} is out of range; use {low} to {high}"


def answers_to(model: str, served: Served) -> bool:
    """Whether a request's `model` names the served model: a name it is listed or accepted under, or its hub id in
    any case (`qwen/qwen3-tts-12hz-1.7b-base`, as --model-path matches it)."""
    if model in served.models or model in served.unlisted_models:
        return True
    return served.hub_id is not None and names_hub_id(model, (served.hub_id,))


def parse_speech_request(data: Mapping[str, Any], served: Served) -> SpeechRequest:
    """Validate a request's fields against what is served; ApiError (400/404) names the field."""
    data = given_fields(data)
    model = _string(data, "model")
    if not answers_to(model, served):
        raise ApiError(
            404,
            f"model {quote(model)} is not served here; this daemon serves {', '.join(map(repr, served.models))}",
            param="model",
            code="model_not_found",
        )
    text = _string(data, "input")
    instructions = _string(data, "instructions", "")
    if len(instructions) > MAX_TEXT_CHARS or CONTROL_CHARACTER.search(instructions):
        raise ApiError(
            400,
            f"'instructions' must be at most {MAX_TEXT_CHARS} characters without control characters",
            param="instructions",
            code="invalid_value",
        )
    try:
        check_unicode("instructions", instructions)
    except InvalidSynthesisRequest as error:
        raise ApiError(400, str(error), param="instructions", code="invalid_value") from None
    response_format = _choice(data, "response_format", "mp3", FORMATS)
    stream_format = _choice(data, "stream_format", "audio", STREAM_FORMATS)
    speed = _number(data, "speed", *SPEED_RANGE)
    sample_rate = _number(data, "sample_rate", *SAMPLE_RATE_RANGE, integer=True)
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
        options=_options(data, served.speech.options),
    )
    _voice_and_reference(data, served, request)
    if speed is not None and float(speed) != 1.0:
        speed_option = "speed" if served.speech.options and "speed" in served.speech.options else "length_scale"
        if speed_option in request.options and speed_option != "speed":
            raise ApiError(400, "give either 'speed' or 'length_scale', not both", param="speed", code="invalid_value")
        request.options[speed_option] = repr(float(speed)) if speed_option == "speed" else repr(1.0 / float(speed))
    return request


def _language(data: Mapping[str, Any], speech: SpeechConfig) -> str:
    language = _string(data, "language", "")
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
    seed = _number(data, "seed", 0, speech.seed_maximum, integer=True)  # the model's range, as its stages check
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
        raise ApiError(
            400,
            f"'voice' must be a string or {{\"id\": string}}, got {json_type(value)}",
            param="voice",
            code="invalid_type",
        )
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
    ref_text = _string(data, "ref_text", "")
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


def _options(data: Mapping[str, Any], declared: Mapping[str, OptionSpec] | None) -> dict[str, str]:
    """Fields beyond FIELDS are model options: checked against the model's declaration, sent as strings."""
    options: dict[str, str] = {}
    for key, value in data.items():
        if key in FIELDS:
            continue
        if key == "stream" and declared is not None and key not in declared:  # the chat API's, sent here too
            raise ApiError(
                400,
                "unknown field 'stream': the speech API always streams the audio as it is made; "
                'for events, send "stream_format": "sse"',
                param=key,
                code="unknown_parameter",
            )
        if not OPTION_KEY.match(key):
            raise ApiError(
                400,
                f"unknown field {quote(key)}; extra fields are model options named with letters, digits, '_', '.', '-'",
                param=key,
                code="unknown_parameter",
            )
        if declared is not None and key not in declared:
            accepted = ", ".join(sorted(declared)) or "none"
            raise ApiError(
                400,
                f"unknown field {key!r}; this model's options are: {accepted} (GET /v1/models)",
                param=key,
                code="unknown_parameter",
            )
        options[key] = _option_value(key, value, declared[key] if declared is not None else None)
    return options


def _option_value(key: str, value: Any, spec: OptionSpec | None) -> str:
    if spec is not None:
        _check_option(key, value, spec)
        if spec.type == "integer":
            return str(int(value))  # 30.0 goes to the stage as "30": every stage reads a whole number so
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ApiError(400, f"option {key!r} must be finite", param=key, code="invalid_value")
        return repr(value)
    if isinstance(value, str):
        return value
    raise ApiError(
        400,
        f"option {key!r} must be a string, number or boolean, got {json_type(value)}",
        param=key,
        code="invalid_type",
    )


def _check_option(key: str, value: Any, spec: OptionSpec) -> None:
    kinds: dict[str, tuple[type, ...]] = {
        "number": (int, float),
        "integer": (int, float),  # a float only without a fraction (`integral`)
        "boolean": (bool,),
        "string": (str,),
    }
    low = "-inf" if spec.minimum is None else plain(spec.minimum)
    high = "inf" if spec.maximum is None else plain(spec.maximum)
    if spec.type in ("number", "integer") and isinstance(value, float) and math.isinf(value):  # 1e400 in the JSON
        raise ApiError(400, _out_of_range(f"option {key}", value, low, high), param=key, code="invalid_value")
    if (
        (isinstance(value, bool) and spec.type != "boolean")
        or not isinstance(value, kinds[spec.type])
        or (spec.type == "integer" and not integral(value))
    ):
        raise ApiError(
            400, f"option {key!r} must be of type {spec.type}, got {json_type(value)}", param=key, code="invalid_type"
        )
    if spec.type in ("number", "integer") and isinstance(value, (int, float)):  # it is, after the check above
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
            raise ApiError(400, _out_of_range(f"option {key}", value, low, high), param=key, code="invalid_value")


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
