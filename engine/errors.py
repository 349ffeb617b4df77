"""The engine error family. Each error knows its HTTP status and, where it has one, the request field
at fault; servers render them as OpenAI-style bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations


class EngineError(Exception):
    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status_code,
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
