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
