"""The call table: the audit log (and its runbook records) and API tokens."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of
from fleetctl.controller.responses import AuditEventView, TokenCreated, TokenRevoked, TokenView
from fleetctl.controller.runbook_events import RunbookEventRecorded


class AdminCalls:
    """The audit log and API tokens."""

    # audit and tokens
    @endpoint("GET", "/api/v1/audit", list[AuditEventView])
    def list_audit(since: str | None = None, actor: str | None = None, limit: int | None = None) -> Request:
        return Request(params=params_of(since=since, actor=actor, limit=limit))

    @endpoint("POST", "/api/v1/audit/runbook", RunbookEventRecorded)
    def record_runbook(event: dict[str, Any], reason: str | None = None) -> Request:
        """One event of a runbook run (the fields of fleetctl.controller.runbook_events.RunbookEvent)."""
        return Request(json=event, reason=reason)

    @endpoint("POST", "/api/v1/tokens", TokenCreated)
    def create_token(name: str, role: str, reason: str | None = None) -> Request:
        """The new token is in `token`; it is shown only here."""
        return Request(json={"name": name, "role": role}, reason=reason)

    @endpoint("GET", "/api/v1/tokens", list[TokenView])
    def list_tokens() -> Request:
        return Request()

    @endpoint("DELETE", "/api/v1/tokens/{name}", TokenRevoked)
    def revoke_token(name: str, reason: str | None = None, force: bool = False) -> Request:
        """`force`: even the last active admin token, or the one this client uses (refused with 409 otherwise)."""
        return Request(path={"name": name}, reason=reason, params={"force": "true"} if force else None)
