"""One place that turns exceptions into the API's error body {"error": {"code", "message", "field"}}."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm.exc import ObjectDeletedError, StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from fleetctl.errors import Conflict, FleetError, Unavailable, ValidationFailed

log = logging.getLogger(__name__)

_LOCATIONS = {"body", "query", "path", "header", "cookie"}
_NAMED_IN_MESSAGE = re.compile(r"^([a-z_][a-z0-9_]*): (.+)$")  # a model validator may name its field first
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 400: "bad_request", 413: "payload_too_large"}


def error_response(exc: FleetError) -> JSONResponse:
    return JSONResponse(exc.to_body(), status_code=exc.status)


def validation_error(errors: list[Any]) -> ValidationFailed:
    """The first pydantic error as a ValidationFailed naming the dotted field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ())]
    if first.get("type") == "json_invalid":
        return ValidationFailed(f"body: invalid JSON ({first.get('msg')})", field="body")
    path = loc[1:] if loc and loc[0] in _LOCATIONS else loc
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    union = _union_members(errors, loc)
    if union:  # every member of a union refused the value: name the field, not the first member's tag
        path = path[:-1]
        message = "matches none of its accepted forms: " + "; ".join(union)
    named = _NAMED_IN_MESSAGE.match(message)
    if named:
        path, message = [*path, named.group(1)], named.group(2)
    field = ".".join(path) or (loc[0] if loc else None)
    return ValidationFailed(f"{field}: {message}" if field else message, field=field)


def _union_members(errors: list[Any], loc: list[str]) -> list[str]:
    """The members' messages when `errors` are one union field's refusals (same location but the last
    element, the member's tag); empty otherwise."""
    if len(errors) < 2 or len(loc) < 2:
        return []
    same_field = [e for e in errors if [str(p) for p in e.get("loc", ())][:-1] == loc[:-1]]
    value = errors[0].get("input")
    # sibling fields of one object also share a prefix, but each has its own input (or is missing)
    if len(same_field) < 2 or any(e.get("type") == "missing" or e.get("input") is not value for e in same_field):
        return []
    return [f"{e['loc'][-1]}: {str(e.get('msg', '')).removeprefix('Value error, ')}" for e in same_field[:4]]


async def _fleet_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FleetError)
    return error_response(exc)


async def _request_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(list(exc.errors())))


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI could not decode the body (not UTF-8): as invalid as bad JSON
        return error_response(ValidationFailed(f"body: could not be read as JSON ({exc.detail})", field="body"))
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    error = FleetError(str(exc.detail), code=code, status=exc.status_code)
    return JSONResponse(error.to_body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _integrity(_request: Request, _exc: Exception) -> JSONResponse:
    return error_response(Conflict("a concurrent change conflicted with this one; retry"))


async def _concurrent_change(_request: Request, _exc: Exception) -> JSONResponse:
    """The row changed or went away between this call's read and its write (models.Versioned)."""
    return error_response(Conflict("changed or deleted by a concurrent call; re-read and retry", code="concurrent_change"))


async def _database_down(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", type(exc).__name__)
    return error_response(Unavailable("the controller's database is unavailable; retry"))


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled %s in request", type(exc).__name__, exc_info=exc)
    return error_response(FleetError("internal error; see the controller log"))


def install(app: FastAPI) -> None:
    app.add_exception_handler(FleetError, _fleet_error)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(IntegrityError, _integrity)
    app.add_exception_handler(StaleDataError, _concurrent_change)
    app.add_exception_handler(ObjectDeletedError, _concurrent_change)
    app.add_exception_handler(OperationalError, _database_down)
    app.add_exception_handler(Exception, _unexpected)
