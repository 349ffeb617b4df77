"""Admin: API tokens (create shows the token once; revoke keeps the row), the audit log (read-only), and the
audit records of runbook runs (`fleetctl runbook run` sends one per start, step and finish)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query

from fleetctl.controller import audit, tokens
from fleetctl.controller.api.deps import Change, get_runtime, mutation, require
from fleetctl.controller.audit import NOOP, OK
from fleetctl.controller.auth import ADMIN, OPERATOR, VIEWER
from fleetctl.controller.responses import AuditEventView, TokenCreated, TokenRevoked, TokenView
from fleetctl.controller.runbook_events import RunbookEvent, RunbookEventRecorded, audit_result, audit_target
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.schemas import Body, TokenCreate

router = APIRouter(prefix="/api/v1", tags=["admin"])


@router.post("/tokens", name="token.create", status_code=201, response_model=TokenCreated)
def token_create(body: TokenCreate, change: Change = Depends(mutation(ADMIN))) -> dict[str, Any]:
    runtime = change.runtime
    with runtime.store.session() as session:
        row, token = tokens.create_token(session, body.name, body.role, change.actor, runtime.clock())
        change.record(session, target=body.name, status=201)
        view = tokens.token_view(row)
    return {**view, "token": token}


@router.get("/tokens", name="token.list", response_model=list[TokenView], dependencies=[Depends(require(ADMIN))])
def token_list(runtime: ControllerRuntime = Depends(get_runtime)) -> list[dict[str, Any]]:
    with runtime.store.session() as session:
        return [tokens.token_view(row) for row in tokens.list_tokens(session)]


@router.delete("/tokens/{name}", name="token.revoke", response_model=TokenRevoked)
def token_revoke(
    name: str, body: Body | None = None, change: Change = Depends(mutation(ADMIN)),
    force: bool = Query(default=False, description="revoke even the last active admin token, or the caller's own"),
) -> dict[str, Any]:
    """409 `last_admin` / `own_token` unless `force`; a forced revocation is audited with what it overrode."""
    runtime = change.runtime
    with runtime.store.session() as session:
        outcome = tokens.revoke_token(session, name, runtime.clock(), requester=change.actor, force=force)
        detail = {"force": True, "overridden": list(outcome.overridden)} if outcome.overridden else None
        change.record(session, target=name, result=OK if outcome.revoked else NOOP,
                      code="forced" if outcome.overridden else None, detail=detail)
    runtime.tokens.clear()
    return {"name": name, "result": "revoked" if outcome.revoked else "unchanged", "overridden": list(outcome.overridden)}


@router.get("/audit", name="audit.list", response_model=list[AuditEventView], dependencies=[Depends(require(VIEWER))])
def audit_list(
    since: str | None = Query(default=None, description="a duration ago (15m, 2h, 7d) or an ISO 8601 time"),
    actor: str | None = Query(default=None, description="token name"),
    limit: int = Query(default=1000, ge=1, le=audit.MAX_LIST),
    runtime: ControllerRuntime = Depends(get_runtime),
) -> list[dict[str, Any]]:
    now = runtime.clock()
    start = audit.parse_since(since, now) if since else None
    with runtime.store.session() as session:
        return [audit.event_view(row) for row in audit.list_events(session, start, actor, limit)]


@router.post("/audit/runbook", name="runbook.record", response_model=RunbookEventRecorded)
def runbook_record(body: RunbookEvent, change: Change = Depends(mutation(OPERATOR))) -> dict[str, Any]:
    """Record one event of a runbook run as its own audit action (`runbook.start|step|finish`): what ran and
    its outcome. The runbook's commands are audited by their own routes as well."""
    action, target, result = f"runbook.{body.event}", audit_target(body), audit_result(body.outcome)
    detail = body.model_dump(include={"run_id", "phase", "step", "kind", "text", "detail"}, exclude_none=True)
    entry = audit.AuditRecord(change.actor, action, target, change.reason, change.digest, result, 200, body.outcome, detail)
    with change.runtime.store.session() as session:
        audit.record(session, entry, change.runtime.clock())
    return {"action": action, "target": target, "result": result}
