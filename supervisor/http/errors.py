"""OpenAI's error envelope, `{"error": {"message", "type", "param", "code"}}`, mapped from pipeline statuses."""

from __future__ import annotations

from typing import Any, Mapping

from starlette.responses import JSONResponse

from stagevisor.supervisor.dataplane.limits import AUDIO_LIMIT_EXCEEDED
from stagevisor.supervisor.errors import RequestFailed

# grpc.StatusCode name (what RequestFailed and AdmissionRejected carry) -> (HTTP status, OpenAI error type).
STATUS_FOR = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "DEADLINE_EXCEEDED": (504, "timeout_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (429, "rate_limit_error"),
    "UNAVAILABLE": (503, "service_unavailable_error"),
    "CANCELLED": (499, "cancelled"),
    "INTERNAL": (500, "server_error"),
}

NOT_RETRIED = frozenset({"DEADLINE_EXCEEDED"})
"""Statuses whose HTTP answer (a 5xx) OpenAI's SDKs would retry on their own (twice by default), though the same
request runs past --request-timeout again: these answers carry `X-Should-Retry: false`, which the SDKs obey."""
CONFLICT = 409
"""A name conflict here (voice_exists, voice_not_removable), which a retry meets again; OpenAI's SDKs retry a 409
(a lock timeout at OpenAI) unless told not to, so it carries `X-Should-Retry: false` too."""

FAILURE_CODES = {AUDIO_LIMIT_EXCEEDED: (400, "invalid_request_error")}
"""Failures whose gRPC status would read wrong over HTTP. The audio cap is RESOURCE_EXHAUSTED to gRPC, but the
same text makes the same audio again: HTTP reports the request's fault (400), not a rate limit (429), which
OpenAI's SDKs retry on their own and a WebSocket closes as "try again later"."""

HTTP_PARAM = {"text": "input", "reference_transcript": "ref_text", "reference_audio": "ref_audio"}
"""The HTTP name of a request field an error names (InvalidSynthesisRequest.field, RequestFailed.field: the gRPC
request's names); `voice`, `instructions`, `language`, `seed` and an option's key keep theirs."""


class ApiError(Exception):
    """An error the client gets as OpenAI's envelope; `status` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        if status == CONFLICT:
            self.headers.setdefault("X-Should-Retry", "false")

    @classmethod
    def from_status(
        cls, status: str, message: str, *, code: str | None = None, headers: Mapping[str, str] | None = None
    ) -> "ApiError":
        """From a grpc.StatusCode name, as the gateway and admission report it."""
        http, kind = STATUS_FOR.get(status, (500, "server_error"))
        if status in NOT_RETRIED:
            headers = {**(headers or {}), "X-Should-Retry": "false"}
        return cls(http, message, type=kind, code=code or status.lower(), headers=headers)

    @classmethod
    def from_failure(cls, error: RequestFailed) -> "ApiError":
        """A request's failure, its message with the request id (and the id as `X-Request-Id`, as an audio answer
        carries it); by its code where FAILURE_CODES names it. The failing stage's own code (`QWEN3_UNKNOWN_SPEAKER`)
        is the envelope's `code`, the status's name where it gave none; the request field it names (`voice`) the
        envelope's `param`, in the HTTP API's name for it. Its `retry_after` is the `Retry-After`."""
        headers = {"X-Request-Id": error.request_id} if error.request_id else {}
        if error.retry_after is not None:  # a worker on its route is being restarted
            headers["Retry-After"] = str(error.retry_after)
        if error.code in FAILURE_CODES:
            http, kind = FAILURE_CODES[error.code]
            return cls(http, error.public_message(), type=kind, code=error.code, headers=headers)
        refused = cls.from_status(error.status, error.public_message(), code=error.code or None, headers=headers)
        refused.param = HTTP_PARAM.get(error.field, error.field) or None
        return refused

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


async def refuse(error: ApiError, scope: dict[str, Any], receive: Any, send: Any, *, close_reason: str = "") -> None:
    """Answer an HTTP request, or a WebSocket handshake (its HTTP denial response), with `error`'s envelope: the
    coded refusal of the guards in front of the app (Host, Origin, bearer token).

    A server without the WebSocket denial response gets a close before the handshake completes (the client
    sees the upgrade fail with 403), whose reason is `close_reason`, or the error's code.
    """
    if scope.get("type") == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008, "reason": close_reason or error.code})
        return
    await error.response()(scope, receive, send)
