"""FastAPI dependencies: the runtime, authentication with a required role, and the audit context of a
mutating call (`Change`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from fleetctl.controller import audit
from fleetctl.controller.api.middleware import CONTEXT_KEY, RequestContext
from fleetctl.controller.auth import Principal, authenticate, authorize
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.versions import IF_MATCH, parse_if_match
from fleetctl.errors import ValidationFailed
from fleetctl.replica_class import NAME_PATTERN

bearer_scheme = HTTPBearer(auto_error=False, description="an API token: viewer, operator, admin or agent")


def get_runtime(request: Request) -> ControllerRuntime:
    return request.app.state.runtime


def require(role: str | None) -> Callable[..., Principal]:
    """A dependency that authenticates the bearer token (401) and checks it has `role` (403; None: any
    role, the handler decides)."""

    async def dependency(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer_scheme)) -> Principal:
        runtime = get_runtime(request)
        token = credentials.credentials if credentials else None
        principal = runtime.tokens.get(token) if token else None
        if principal is None:  # not seen lately: look it up (in a worker thread, the store is synchronous)
            principal = await run_in_threadpool(lookup_principal, runtime, token)
        request.state.principal = principal  # the audit of a refusal names who was refused
        if role is not None:
            authorize(principal, role)
        return principal

    return dependency


def lookup_principal(runtime: ControllerRuntime, token: str | None) -> Principal:
    with runtime.store.session() as session:
        principal = authenticate(session, token, runtime.env_token_sha256)
    runtime.tokens.put(token or "", principal)
    return principal


@dataclass(frozen=True)
class Change:
    """Who is changing what, and why: handed to a mutating handler, which records the outcome."""

    principal: Principal
    action: str
    reason: str | None
    digest: str
    runtime: ControllerRuntime

    @property
    def actor(self) -> str:
        return self.principal.name

    def record(self, session: Session, target: str, result: str = audit.OK, status: int = 200,
               code: str | None = None, detail: dict[str, Any] | None = None) -> None:
        entry = audit.AuditRecord(self.actor, self.action, target, self.reason, self.digest, result, status, code, detail)
        audit.record(session, entry, self.runtime.clock())


def mutation(role: str) -> Callable[..., Change]:
    authenticated = require(role)

    def dependency(request: Request, principal: Principal = Depends(authenticated)) -> Change:
        context: RequestContext = request.scope[CONTEXT_KEY]
        return Change(principal, request.scope["route"].name, context.reason, context.digest, get_runtime(request))

    return dependency


def if_match(request: Request) -> int | None:
    """The version an `If-Match` header names (optimistic concurrency, controller/versions.py)."""
    return parse_if_match(request.headers.get(IF_MATCH))


def valid_name(value: str, field: str = "name") -> str:
    """Names in paths follow the same rule as names in bodies (a 422 naming the field otherwise)."""
    if not NAME_PATTERN.match(value):
        raise ValidationFailed(
            f"{field}: must be 1-63 lowercase letters, digits or '-', starting and ending with a letter or digit",
            field=field,
        )
    return value
