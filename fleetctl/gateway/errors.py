"""The gateway's error family. Each error knows its HTTP status; the gateway renders them in the OpenAI
shape {"error": {"message", "type", "param", "code"}} (docs/contracts.md). Pure decision functions raise
these only for invalid input; "no capacity" is a value (an AdmissionDecision), not an exception."""

from __future__ import annotations


class GatewayError(Exception):
    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def to_body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status_code}}


class InvalidRoute(GatewayError):
    """The request names a class or option the model does not have (e.g. a bad x-fleet-pin-class)."""

    status_code = 400
    error_type = "BadRequestError"


class NoRoute(GatewayError):
    """The model has no class with traffic, or no healthy engine to serve it."""

    status_code = 503
    error_type = "ServiceUnavailableError"


class BadRequest(GatewayError):
    """The request itself is wrong: malformed JSON, a bad field, a prompt that does not fit the context window."""

    status_code = 400
    error_type = "BadRequestError"


class Forbidden(GatewayError):
    """A known API key asking for what it may not do (a canary probe's headers without a probe key)."""

    status_code = 403
    error_type = "PermissionDeniedError"


class Unauthorized(GatewayError):
    """No API key, or one the gateway does not know. The message never repeats the key."""

    status_code = 401
    error_type = "AuthenticationError"


class ModelNotFound(GatewayError):
    status_code = 404
    error_type = "NotFoundError"


class TooManyRequests(GatewayError):
    """A client's rate limit, or admission control predicting the SLO would break: 429 with Retry-After."""

    status_code = 429
    error_type = "RateLimitError"

    def __init__(self, message: str, retry_after_s: int, param: str | None = None):
        super().__init__(message, param)
        self.retry_after_s = retry_after_s


class UpstreamFailed(GatewayError):
    """Every engine tried failed before the first token. `status_code` is the last engine's status when it
    answered (429, 503, 5xx), else 502 (refused or dropped) or 504 (timed out)."""

    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, status_code: int = 502, retry_after_s: int | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
