"""The control plane's error family, shared by the controller (raised, rendered as HTTP errors) and the
client (rebuilt from HTTP error bodies), so both sides speak the same small vocabulary.

Every error carries `code` (a machine word such as "not_found"), `message` (one readable line), `field`
(the dotted request field at fault, or None) and `status` (the HTTP status). The wire form is
`{"error": {"code", "message", "field"}}`; the CLI maps the classes to exit codes in one place
(fleetctl/cli/failures.py).
"""

from __future__ import annotations

from typing import Any


class FleetError(Exception):
    """Base of the family. Subclasses fix the default status and code."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.field = field
        self.status = status or type(self).status

    def to_body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "field": self.field}}

    def __str__(self) -> str:
        return self.message


class NotFound(FleetError):
    status = 404
    code = "not_found"


class AuthError(FleetError):
    """401 (token missing or unknown) or 403 (the token's role is not enough; the message names the role)."""

    status = 401
    code = "unauthorized"


class Conflict(FleetError):
    """409: the request is well-formed but refused by the current state (a race, a guard)."""

    status = 409
    code = "conflict"


class ValidationFailed(FleetError):
    """422 (a field is invalid; `field` names it) or 413 (the body is too large)."""

    status = 422
    code = "validation_failed"


class Unavailable(FleetError):
    """The controller (or its database) cannot answer now: 503, a connection error or a timeout."""

    status = 503
    code = "unavailable"


_BY_STATUS: dict[int, type[FleetError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    413: ValidationFailed,
    422: ValidationFailed,
    400: ValidationFailed,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_from_body(status: int, body: Any) -> FleetError:
    """Rebuild an error from an HTTP status and a (possibly non-JSON, possibly foreign) response body."""
    detail = body.get("error") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        detail = {}
    cls = _BY_STATUS.get(status, FleetError)
    message = str(detail.get("message") or f"HTTP {status}")
    field = detail.get("field")
    return cls(message, code=detail.get("code") or None, field=field if isinstance(field, str) else None, status=status)
