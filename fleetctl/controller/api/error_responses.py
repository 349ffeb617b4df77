"""The error responses each controller route declares in the OpenAPI schema, with the error body's shape.

Every error the API answers is `{"error": {"code", "message", "field"}}` (api/errors.py); a client generated
from the schema, or a schema-driven test, learns from here which statuses a route can answer and why. What a
route can answer follows from what it is: an authenticated route can be refused (401, 403), a route that
names an object in its path can miss it (404), a mutation can conflict (409), any request can be too large
(413) or invalid (422), and any route that reads the store can find it down (503). 500 is declared everywhere: it is a bug, never a designed answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
UNAUTHENTICATED_PATHS = frozenset({"/healthz", "/metrics"})


class ErrorDetail(BaseModel):
    code: str = Field(description="a machine word: validation_failed, not_found, conflict, version_conflict, ...")
    message: str = Field(description="one readable line")
    field: str | None = Field(default=None, description="the dotted request field at fault, if one is")


class ErrorBody(BaseModel):
    error: ErrorDetail


ERROR_BODY_REF = "#/components/schemas/ErrorBody"

MEANINGS = {
    401: "token missing, unknown or revoked",
    403: "the token's role is not enough for this call",
    404: "the named object does not exist",
    409: "refused by the current state: a concurrent change (retry after re-reading), a version that no longer "
         "matches If-Match, or a guard (the code says which)",
    413: "the body is larger than the controller's limit",
    422: "a field is invalid; `field` names it",
    500: "a bug in the controller (see its log)",
    503: "the controller's database is unavailable; retry",
}


def error_statuses(route: APIRoute) -> list[int]:
    """The error statuses `route` can answer. Every request passes the request guard, which refuses a body
    over the limit (413) and unstorable text in the path, query or body (422)."""
    statuses = {413, 422, 500}
    if route.path not in UNAUTHENTICATED_PATHS:
        statuses |= {401, 403, 503}
    if "{" in route.path:
        statuses.add(404)
    if set(route.methods or ()) & MUTATING:
        statuses.add(409)
    return sorted(statuses)


def declare(routes: Iterable[Any]) -> None:
    """Add the error responses to every API route (routes that declare a status themselves keep theirs)."""
    for route in routes:
        if not isinstance(route, APIRoute):
            continue
        json_route = getattr(route.response_class, "media_type", "application/json") == "application/json"
        own = {status for status in route.responses if str(status).isdigit() and int(status) >= 400}
        for status in sorted(set(error_statuses(route)) | own, key=int):
            declared = route.responses.setdefault(status, {})
            declared.setdefault("description", MEANINGS.get(int(status), "an error"))
            # Explicit JSON content: FastAPI gives a model the route's own media type (text for /metrics), and
            # ignores a model added to a status the decorator already declared without one.
            declared.setdefault("content", {"application/json": {"schema": {"$ref": ERROR_BODY_REF}}})
            if json_route:
                declared.setdefault("model", ErrorBody)  # also registers ErrorBody among the components
