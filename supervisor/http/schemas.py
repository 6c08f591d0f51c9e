"""The OpenAPI document's shared schemas (its components): the request, answer and error bodies, and `ref` to them."""

from __future__ import annotations

from typing import Any

from stagevisor.supervisor.config import DEFAULT_SEED_MAXIMUM
from stagevisor.supervisor.dataplane.synthesis import MAX_TEXT_CHARS

JSON = "application/json"


def ref(name: str) -> dict[str, str]:
    """A `$ref` to a schema in `SCHEMAS`."""
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A content map: `schema` as application/json."""
    return {JSON: {"schema": schema}}


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
                        {
                            "type": "object",
                            "required": ["id"],
                            "properties": {"id": {"type": "string"}},
                            "additionalProperties": False,
                        },
                    ],
                    "description": "a voice id or alias (GET /v1/audio/voices), or OpenAI's custom-voice form "
                    '{"id": ...}, with no other key',
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
            "workers_silent",
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
            "workers_silent": {
                "type": "array",
                "description": "Each READY worker the daemon took for silent (it missed heartbeats: a frozen "
                "process, a blocked event loop), with the seconds since; not ready while a group has no other.",
                "items": {
                    "type": "object",
                    "required": ["name", "silent_s"],
                    "properties": {"name": {"type": "string"}, "silent_s": {"type": "number"}},
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
