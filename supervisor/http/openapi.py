"""The HTTP API's OpenAPI 3.1 document: one `Operation` per route, the shared schemas, and `document()`.

This is the one place the API is described. `create_app` serves `document()`
at `/openapi.json`; tests/unit/http/test_http_openapi.py fails when a route has no
operation here (or an operation no route), and the Schemathesis fuzz
(tests/integration/test_http_fuzz.py) checks every response against it. A new
route adds its `Operation` to `OPERATIONS` (and its schemas to `SCHEMAS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagevisor.supervisor.config import DEFAULT_SEED_MAXIMUM
from stagevisor.supervisor.dataplane.synthesis import MAX_TEXT_CHARS

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"


def ref(name: str) -> dict[str, str]:
    """A `$ref` to a schema in `SCHEMAS`."""
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {JSON: {"schema": schema}}


ERROR_RESPONSE: dict[str, Any] = {
    "description": "An error in OpenAI's envelope",
    "content": json_body(ref("Error")),
    "headers": {
        "X-Request-Id": {
            "schema": {"type": "string"},
            "description": "on an internal error (500): the id the daemon's log names it by",
        }
    },
}
"""Every operation's `default` response: any status other than those listed carries this body."""

AUDIO_MEDIA_TYPES = ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")


@dataclass(frozen=True)
class Operation:
    """One method on one path: what it takes and what it answers (besides the `default` error)."""

    path: str
    method: str
    operation_id: str
    summary: str
    responses: dict[str, dict[str, Any]]
    request_body: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()
    security: bool = True
    """False for the probes (/health, /ready), which never need the bearer token."""
    description: str = ""
    parameters: tuple[dict[str, Any], ...] = ()
    """Query and path parameters, as OpenAPI Parameter objects."""

    def to_dict(self) -> dict[str, Any]:
        operation: dict[str, Any] = {"operationId": self.operation_id, "summary": self.summary}
        if self.description:
            operation["description"] = self.description
        if self.parameters:
            operation["parameters"] = list(self.parameters)
        if self.tags:
            operation["tags"] = list(self.tags)
        if self.request_body is not None:
            operation["requestBody"] = self.request_body
        operation["responses"] = {**self.responses, "default": ERROR_RESPONSE}
        if not self.security:
            operation["security"] = []
        return operation


def optional(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional request field's schema, null allowed: null is the field not given (OpenAI's SDKs send it)."""
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    nullable = {**schema, "type": [schema["type"], "null"]}
    if "enum" in schema:
        nullable["enum"] = [*schema["enum"], None]
    return nullable


def speech_input(max_text_chars: int) -> dict[str, Any]:
    """The `input` field: the text, up to the limit the daemon admits (the gateway's `max_text_chars`)."""
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": max_text_chars,
        "description": f"the text, at most {max_text_chars} characters (the smallest limit a stage of the served "
        "pipeline declares, else the default)",
    }


def seed_field(seed_maximum: int) -> dict[str, Any]:
    """The `seed` field: 0 to the largest seed the served model declares (its `seed_maximum`)."""
    return optional(
        {
            "type": "integer",
            "minimum": 0,
            "maximum": seed_maximum,
            "description": "the served model's range (GET /v1/models: accepts.seed_range)",
        }
    )


SCHEMAS: dict[str, dict[str, Any]] = {
    "SpeechInput": speech_input(MAX_TEXT_CHARS),
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"], "description": "the request field at fault, where one is"},
                    "code": {
                        "type": ["string", "null"],
                        "description": "what failed: the failing stage's own code where it gave one (UPPER_SNAKE, "
                        "e.g. QWEN3_UNKNOWN_SPEAKER), else the daemon's (invalid_argument, busy, internal, ...)",
                    },
                },
            }
        },
    },
    "SpeechRequest": {
        "type": "object",
        "required": ["model", "input"],
        "description": "OpenAI's fields; any other field is an executor option (a string, number or boolean) "
        "named with letters, digits, '_', '.', '-'. null on any field but model and input is that field not "
        "given (its default).",
        "properties": {
            "model": {
                "type": "string",
                "description": "a name GET /v1/models lists (the model's key, a served name, an OpenAI alias), or "
                "--model-path as the operator gave it",
            },
            "input": ref("SpeechInput"),
            "voice": optional(
                {
                    "anyOf": [
                        {"type": "string"},
                        {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
                    ],
                    "description": "a voice id or alias (GET /v1/audio/voices)",
                }
            ),
            "instructions": optional({"type": "string"}),
            "response_format": optional({"type": "string", "enum": ["mp3", "opus", "aac", "flac", "wav", "pcm"]}),
            "speed": optional({"type": "number", "minimum": 0.25, "maximum": 4.0}),
            "stream_format": optional({"type": "string", "enum": ["audio", "sse"]}),
            "sample_rate": optional(
                {
                    "type": "integer",
                    "minimum": 8000,
                    "maximum": 48000,
                    "description": "the rate of the audio sent (default: pcm 24000, the other formats the model's)",
                }
            ),
            "language": optional({"type": "string", "description": "one of the model's languages (GET /v1/models)"}),
            "seed": seed_field(DEFAULT_SEED_MAXIMUM),
            "ref_audio": optional(
                {
                    "type": "string",
                    "description": "reference audio to clone (base64 or a data URL; WAV, FLAC, MP3 or Ogg, 0.5-30 s)",
                }
            ),
            "ref_text": optional({"type": "string", "description": "what ref_audio says"}),
        },
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
    },
    "BatchRequest": {
        "type": "object",
        "required": ["requests"],
        "properties": {
            "requests": {"type": "array", "minItems": 1, "maxItems": 64, "items": ref("SpeechRequest")},
        },
    },
    "VoiceUpload": {
        "type": "object",
        "required": ["name"],
        "oneOf": [{"required": ["audio"]}, {"required": ["audio_sample"]}],
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"},
            "audio": {"type": "string", "contentMediaType": "application/octet-stream"},
            "audio_sample": {
                "type": "string",
                "contentMediaType": "application/octet-stream",
                "description": "the audio under OpenAI's name for it (its SDK's voices.create); `consent` is ignored",
            },
            "transcript": {"type": "string", "maxLength": 1000},
        },
    },
    "Voice": {
        "type": "object",
        "required": ["id", "type"],
        "properties": {"id": {"type": "string"}, "type": {"enum": ["model", "alias", "uploaded"]}},
    },
    "Version": {
        "type": "object",
        "required": ["version"],
        "properties": {"version": {"type": "string"}, "model": {"type": ["string", "null"]}},
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref("Model")},
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "root": {
                "type": "string",
                "description": "the served model's key (e.g. qwen3-tts), the same for each of its names",
            },
            "stand_in": {
                "type": "boolean",
                "description": "stand-in executors run this model: its stages, the default voice's weights, "
                "not its own",
            },
        },
    },
    "VoiceList": {
        "type": "object",
        "required": ["voices"],
        "properties": {
            "voices": {
                "type": "array",
                "items": {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "state", "pid"],
        "properties": {"status": {"const": "ok"}, "state": {"type": "string"}, "pid": {"type": "integer"}},
    },
    "Ready": {
        "type": "object",
        "required": [
            "ready",
            "state",
            "groups_not_ready",
            "groups_ready",
            "groups_total",
            "workers_ready",
            "workers_total",
        ],
        "properties": {
            "ready": {"type": "boolean"},
            "state": {"type": "string"},
            "groups_not_ready": {
                "type": "array",
                "description": "Each worker that is not READY: a group's, or `group/i` for a replica.",
                "items": {
                    "type": "object",
                    "required": ["name", "state"],
                    "properties": {"name": {"type": "string"}, "state": {"type": "string"}},
                },
            },
            "groups_ready": {
                "type": "integer",
                "description": "Process groups with a READY worker (a replicated group: at least one replica).",
            },
            "groups_total": {"type": "integer", "description": "Process groups in the topology."},
            "workers_ready": {"type": "integer", "description": "Worker processes READY."},
            "workers_total": {"type": "integer", "description": "Worker processes (one per replica)."},
        },
    },
    "Topology": {
        "type": "object",
        "required": ["groups", "stages", "edges", "status", "admission"],
        "description": "`stagevisor topology --format json` plus `status` and `admission`.",
        "properties": {
            "groups": {"type": "array", "items": {"type": "object"}},
            "stages": {"type": "array", "items": {"type": "object"}},
            "edges": {"type": "array", "items": {"type": "object"}},
            "status": {"type": "object"},
            "admission": {"type": "object"},
        },
    },
}


def _ok(description: str, content: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": content}
    if headers:
        response["headers"] = headers
    return response


SPEECH_HEADERS: dict[str, Any] = {
    "X-Request-Id": {
        "required": True,
        "schema": {"type": "string"},
        "description": "the request's id, as the daemon's log and traces name it",
    },
    "X-Sample-Rate": {
        "required": True,
        "schema": {"type": "integer", "minimum": 1},
        "description": "the rate of the audio sent, in Hz (what `pcm` needs to be played)",
    },
    "Cache-Control": {"required": True, "schema": {"type": "string", "const": "no-store"}},
    "X-Accel-Buffering": {
        "required": True,
        "schema": {"type": "string", "const": "no"},
        "description": "asks a proxy (nginx) to pass the audio on as it comes",
    },
}
"""What every audio (or SSE) answer of /v1/audio/speech carries (http/speech.py `synthesize`)."""

RETRY_AFTER = {
    "Retry-After": {
        "schema": {"type": "integer", "minimum": 0},
        "description": "seconds to wait before retrying, when admission control turned the request away",
    }
}
SPEECH_REFUSED = {
    "429": {
        **ERROR_RESPONSE,
        "description": "Too many requests: the queue is full, or the wait for a slot timed out",
        "headers": RETRY_AFTER,
    },
    "503": {
        **ERROR_RESPONSE,
        "description": "Not serving: the daemon is draining, or a process group is down",
        "headers": RETRY_AFTER,
    },
}
"""The speech endpoints' refusals by admission control, with their Retry-After hint (http/speech.py)."""

SPEECH_AUDIO = {media: {"schema": {"type": "string", "contentMediaType": media}} for media in AUDIO_MEDIA_TYPES}
SPEECH_AUDIO["text/event-stream"] = {
    "schema": {"type": "string", "description": "`speech.audio.delta` events, then `speech.audio.done`"}
}

OPERATIONS: list[Operation] = [
    Operation(
        "/v1/audio/speech",
        "post",
        "createSpeech",
        "Synthesize speech (OpenAI-compatible); audio is streamed as the pipeline makes it",
        {
            "200": _ok(
                "The audio, chunked (or server-sent events with stream_format sse)", SPEECH_AUDIO, SPEECH_HEADERS
            ),
            **SPEECH_REFUSED,
        },
        request_body={"required": True, "content": json_body(ref("SpeechRequest"))},
        tags=("audio",),
    ),
    Operation(
        "/v1/models",
        "get",
        "listModels",
        "The model this daemon serves",
        {"200": _ok("Models", json_body(ref("ModelList")))},
        tags=("models",),
    ),
    Operation(
        "/v1/models/{model}",
        "get",
        "retrieveModel",
        "One model this daemon serves, by any name a request may give as `model` (404 model_not_found for another)",
        {"200": _ok("The model", json_body(ref("Model")))},
        tags=("models",),
        parameters=({"name": "model", "in": "path", "required": True, "schema": {"type": "string"}},),
    ),
    Operation(
        "/v1/audio/voices",
        "get",
        "listVoices",
        "The model's voices, the names mapped onto them (OpenAI's, the config's) and uploaded voices",
        {"200": _ok("Voices", json_body(ref("VoiceList")))},
        tags=("audio",),
    ),
    Operation(
        "/v1/audio/speech",
        "get",
        "getSpeech",
        "Synthesize speech from query parameters (the POST body's fields; model defaults to the served one)",
        {"200": _ok("The audio, chunked", SPEECH_AUDIO, SPEECH_HEADERS), **SPEECH_REFUSED},
        tags=("audio",),
        parameters=(
            {"name": "input", "in": "query", "required": True, "schema": ref("SpeechInput")},
            {"name": "voice", "in": "query", "schema": {"type": "string"}},
            {"name": "model", "in": "query", "schema": {"type": "string"}},
            {"name": "response_format", "in": "query", "schema": {"type": "string"}},
            {"name": "sample_rate", "in": "query", "schema": {"type": "integer"}},
        ),
    ),
    Operation(
        "/v1/audio/speech/batch",
        "post",
        "createSpeechBatch",
        "Synthesize several requests; each result (its own status, audio base64) is a JSON line as it finishes",
        {
            "200": _ok(
                "One JSON object per line, in the order the requests finish",
                {"application/x-ndjson": {"schema": {"type": "string"}}},
            )
        },
        request_body={"required": True, "content": json_body(ref("BatchRequest"))},
        tags=("audio",),
    ),
    Operation(
        "/v1/audio/voices",
        "post",
        "uploadVoice",
        "Upload a voice to clone (multipart: name, audio, transcript); kept across restarts",
        {"201": _ok("The stored voice", json_body(ref("Voice")))},
        request_body={"required": True, "content": {"multipart/form-data": {"schema": ref("VoiceUpload")}}},
        tags=("audio",),
    ),
    Operation(
        "/v1/audio/voices/{name}",
        "delete",
        "deleteVoice",
        "Delete an uploaded voice",
        {"200": _ok("Deleted", json_body({"type": "object"}))},
        tags=("audio",),
        parameters=({"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},),
    ),
    Operation(
        "/version",
        "get",
        "version",
        "The stagevisor version and the model served",
        {"200": _ok("Version", json_body(ref("Version")))},
        tags=("operations",),
    ),
    Operation(
        "/v1/topology",
        "get",
        "getTopology",
        "The running process groups, stages, edges, status and admission counters",
        {"200": _ok("Topology", json_body(ref("Topology")))},
        tags=("operations",),
    ),
    Operation(
        "/health",
        "get",
        "health",
        "Liveness: the daemon answers",
        {"200": _ok("Alive", json_body(ref("Health")))},
        tags=("operations",),
        security=False,
    ),
    Operation(
        "/ready",
        "get",
        "ready",
        "Readiness: every process group has a READY worker (one replica of a replicated group) and the daemon is "
        "not draining",
        {
            "200": _ok("Ready", json_body(ref("Ready"))),
            "503": _ok("Not ready (starting, a group down, or draining)", json_body(ref("Ready"))),
        },
        tags=("operations",),
        security=False,
    ),
    Operation(
        "/",
        "get",
        "playground",
        "The playground page",
        {"200": _ok("HTML", {"text/html": {"schema": {"type": "string"}}})},
        tags=("operations",),
    ),
    Operation(
        "/openapi.json",
        "get",
        "openapi",
        "This document",
        {"200": _ok("The OpenAPI 3.1 document", json_body({"type": "object"}))},
        tags=("operations",),
    ),
]

METRICS_OPERATION = Operation(
    "/metrics",
    "get",
    "metrics",
    "Prometheus metrics (absent with --no-metrics)",
    {"200": _ok("Prometheus text exposition", {"text/plain": {"schema": {"type": "string"}}})},
    tags=("operations",),
)


def document(
    operations: list[Operation],
    *,
    version: str,
    authenticated: bool = False,
    title: str = "stagevisor HTTP API",
    max_text_chars: int = MAX_TEXT_CHARS,
    seed_maximum: int = DEFAULT_SEED_MAXIMUM,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `operations`; `authenticated` declares the bearer token scheme.

    `max_text_chars` is the longest `input` the daemon admits now: the smallest limit the pipeline's stages
    declared when their workers became READY, so the document is made when it is asked for. `seed_maximum` is
    the served model's largest seed.
    """
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method] = operation.to_dict()
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": {**SCHEMAS, "SpeechInput": speech_input(max_text_chars)}},
    }
    request = SCHEMAS["SpeechRequest"]
    doc["components"]["schemas"]["SpeechRequest"] = {
        **request,
        "properties": {**request["properties"], "seed": seed_field(seed_maximum)},
    }
    if authenticated:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
