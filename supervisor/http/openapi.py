"""The HTTP API's OpenAPI 3.1 document: `Operation` (one method on one path) and `document()`, which assembles it.

This is the one place the API is described. `create_app` serves `document()`
at `/openapi.json`; tests/unit/http/test_http_openapi.py fails when a route has no
operation (or an operation no route), and the Schemathesis fuzz
(tests/integration/test_http_fuzz.py) checks every response against it. A new
route adds its `Operation` to `OPERATIONS` (operations.py) and its schemas to
`SCHEMAS` (schemas.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stagevisor.supervisor.config import DEFAULT_SEED_MAXIMUM
from stagevisor.supervisor.dataplane.synthesis import MAX_TEXT_CHARS
from stagevisor.supervisor.http.schemas import SCHEMAS, json_body, ref, seed_field, speech_input

OPENAPI_VERSION = "3.1.0"


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


def ok(description: str, content: dict[str, Any], headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """A success response: its description, its content by media type, and its headers where it has any."""
    response: dict[str, Any] = {"description": description, "content": content}
    if headers:
        response["headers"] = headers
    return response


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
