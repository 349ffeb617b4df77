"""The engine error family. Each error knows its HTTP status and, where it has one, the request field
at fault; servers render them as OpenAI-style bodies: {"error": {"message", "type", "param", "code"}}
(`ErrorBody`, the schema the engine's OpenAPI document declares for every error response).

Invariant: a rendered body always encodes as UTF-8 JSON, even when its message or field name quotes input
holding a NUL or an unpaired surrogate (they are escaped, `printable`).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str = Field(description="what is wrong, for a person")
    type: str = Field(description="the error class, e.g. BadRequestError, ServiceUnavailableError")
    param: str | None = Field(default=None, description="the request field at fault, dotted (messages.0.role)")
    code: int = Field(description="the HTTP status")


class ErrorBody(BaseModel):
    """Every error response of the engine, in OpenAI's shape."""

    error: ErrorDetail


def printable(text: str) -> str:
    """`text` with NULs and unpaired surrogates escaped, so that it encodes as UTF-8 JSON."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


class EngineError(Exception):
    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict:
        return self.body(self.message, self.param, self.status_code, self.error_type)

    @staticmethod
    def body(message: str, param: str | None, status: int, error_type: str) -> dict:
        """An ErrorBody as plain JSON."""
        return {
            "error": {
                "message": printable(message),
                "type": error_type,
                "param": None if param is None else printable(param),
                "code": status,
            }
        }


class InvalidRequest(EngineError):
    status_code = 400
    error_type = "BadRequestError"


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus max_tokens) does not fit the model's context window."""


class Unauthorized(EngineError):
    """A missing or wrong API key."""

    status_code = 401
    error_type = "AuthenticationError"


class ModelNotFound(EngineError):
    status_code = 404
    error_type = "NotFoundError"


class EngineOverloaded(EngineError):
    """No capacity now; the client may retry (429 with Retry-After)."""

    status_code = 429
    error_type = "RateLimitError"


class EngineDraining(EngineError):
    """The engine is shutting down or draining: retry elsewhere (503 with Retry-After)."""

    status_code = 503
    error_type = "ServiceUnavailableError"


class KVTransferError(EngineError):
    """A P/D KV transfer failed and the policy says fail rather than recompute."""

    status_code = 502
    error_type = "KVTransferError"


_STATUS_MEANINGS = {
    400: "invalid request; `param` names the field at fault",
    401: "missing or wrong API key",
    404: "no such route",
    429: "no capacity now; retry after Retry-After seconds",
    500: "internal error",
    502: "the K/V transfer from the prefill engine failed (kv_load_failure_policy fail)",
    503: "draining or shutting down; retry on another engine after Retry-After seconds",
}


def openapi_error_responses(*statuses: int) -> dict[int | str, dict]:
    """A route's OpenAPI `responses` for the errors it can answer (500 always), each an ErrorBody. "default"
    covers what the framework itself answers (an unknown route or method), in the same shape; it also keeps
    FastAPI from declaring the 422 the engine never sends (validation errors are 400)."""
    responses: dict[int | str, dict] = {
        status: {"model": ErrorBody, "description": _STATUS_MEANINGS[status]} for status in sorted({*statuses, 500})
    }
    responses["default"] = {"model": ErrorBody, "description": "any other error"}
    return responses
