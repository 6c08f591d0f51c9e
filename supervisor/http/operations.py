"""The HTTP API's operations: one `Operation` per route, with the headers and refusals the speech routes share."""

from __future__ import annotations

from typing import Any

from stagevisor.supervisor.http.openapi import ERROR_RESPONSE, Operation, ok
from stagevisor.supervisor.http.schemas import json_body, ref

AUDIO_MEDIA_TYPES = ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")

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
            "200": ok(
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
        {"200": ok("Models", json_body(ref("ModelList")))},
        tags=("models",),
    ),
    Operation(
        "/v1/models/{model}",
        "get",
        "retrieveModel",
        "One model this daemon serves, by any name a request may give as `model` (404 model_not_found for another)",
        {"200": ok("The model", json_body(ref("Model")))},
        tags=("models",),
        parameters=({"name": "model", "in": "path", "required": True, "schema": {"type": "string"}},),
    ),
    Operation(
        "/v1/audio/voices",
        "get",
        "listVoices",
        "The model's voices, the names mapped onto them (OpenAI's, the config's) and uploaded voices",
        {"200": ok("Voices", json_body(ref("VoiceList")))},
        tags=("audio",),
    ),
    Operation(
        "/v1/audio/speech",
        "get",
        "getSpeech",
        "Synthesize speech from query parameters (the POST body's fields; model defaults to the served one)",
        {"200": ok("The audio, chunked", SPEECH_AUDIO, SPEECH_HEADERS), **SPEECH_REFUSED},
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
            "200": ok(
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
        {"201": ok("The stored voice", json_body(ref("Voice")))},
        request_body={"required": True, "content": {"multipart/form-data": {"schema": ref("VoiceUpload")}}},
        tags=("audio",),
    ),
    Operation(
        "/v1/audio/voices/{name}",
        "delete",
        "deleteVoice",
        "Delete an uploaded voice",
        {"200": ok("Deleted", json_body({"type": "object"}))},
        tags=("audio",),
        parameters=({"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},),
    ),
    Operation(
        "/version",
        "get",
        "version",
        "The stagevisor version and the model served",
        {"200": ok("Version", json_body(ref("Version")))},
        tags=("operations",),
    ),
    Operation(
        "/v1/topology",
        "get",
        "getTopology",
        "The running process groups, stages, edges, status and admission counters",
        {"200": ok("Topology", json_body(ref("Topology")))},
        tags=("operations",),
    ),
    Operation(
        "/health",
        "get",
        "health",
        "Liveness: the daemon answers",
        {"200": ok("Alive", json_body(ref("Health")))},
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
            "200": ok("Ready", json_body(ref("Ready"))),
            "503": ok("Not ready (starting, a group down, or draining)", json_body(ref("Ready"))),
        },
        tags=("operations",),
        security=False,
    ),
    Operation(
        "/",
        "get",
        "playground",
        "The playground page",
        {"200": ok("HTML", {"text/html": {"schema": {"type": "string"}}})},
        tags=("operations",),
    ),
    Operation(
        "/openapi.json",
        "get",
        "openapi",
        "This document",
        {"200": ok("The OpenAPI 3.1 document", json_body({"type": "object"}))},
        tags=("operations",),
    ),
]

METRICS_OPERATION = Operation(
    "/metrics",
    "get",
    "metrics",
    "Prometheus metrics (absent with --no-metrics)",
    {"200": ok("Prometheus text exposition", {"text/plain": {"schema": {"type": "string"}}})},
    tags=("operations",),
)
