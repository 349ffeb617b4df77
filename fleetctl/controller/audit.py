"""The audit log: one append-only row per mutating API call (who, what, target, why, payload digest,
result, when; and `detail` when a guard was explicitly overridden, e.g. an allowed correctness change).
Successful changes are recorded in the same transaction as the change; refused (4xx) and failed (5xx)
calls are recorded afterwards by the API middleware, when the change itself was rolled back.
There is no update or delete path.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import AuditEvent
from fleetctl.errors import ValidationFailed

OK, NOOP, REFUSED, ERROR = "ok", "noop", "refused", "error"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_LIST = 10_000


def payload_digest(body: bytes) -> str:
    """sha256 of the body's canonical JSON (sorted keys, no spaces); of the raw bytes if it is not JSON."""
    try:
        canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode() if body else b""
    except ValueError:
        canonical = body
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True)
class AuditRecord:
    actor: str
    action: str
    target: str
    reason: str | None
    payload_digest: str
    result: str
    status: int
    code: str | None = None
    detail: dict[str, Any] | None = None  # what a guard explicitly let through (e.g. an allowed correctness change)


def record(session: Session, entry: AuditRecord, now: datetime) -> None:
    session.add(AuditEvent(
        at=now, actor=entry.actor[:65], action=entry.action[:100], target=entry.target[:300],
        reason=entry.reason, payload_digest=entry.payload_digest, result=entry.result,
        code=entry.code, status=entry.status, detail=entry.detail,
    ))


def parse_since(value: str, now: datetime) -> datetime:
    """'15m', '2h', '7d', '1w' (ago) or an ISO 8601 time (UTC if it has no offset)."""
    match = _DURATION.match(value.strip())
    if match:
        return now - timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValidationFailed(f"since: {value!r} is neither a duration like 15m/2h/7d nor an ISO time", field="since") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=now.tzinfo)


def list_events(session: Session, since: datetime | None, actor: str | None, limit: int) -> list[AuditEvent]:
    """Newest last, at most `limit` (the newest ones)."""
    query = select(AuditEvent)
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if actor:
        query = query.where(AuditEvent.actor == actor)
    rows = list(session.execute(query.order_by(AuditEvent.id.desc()).limit(min(limit, MAX_LIST))).scalars())
    return rows[::-1]


def event_view(row: AuditEvent) -> dict[str, Any]:
    return {
        "id": row.id, "at": row.at.isoformat(), "actor": row.actor, "action": row.action, "target": row.target,
        "reason": row.reason, "payload_digest": row.payload_digest, "result": row.result, "code": row.code,
        "status": row.status, "detail": row.detail,
    }
