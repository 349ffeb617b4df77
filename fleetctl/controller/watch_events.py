"""The change stream's events (watch_contract.FleetEventView): the audit log, the canary's verdict changes and
the rollouts' transitions, read from their append-only tables by id.

`EventCursors` holds the last id read from each table. `latest` reads the newest events (a snapshot's, and
where the cursors start); `since` reads what was appended after the cursors and moves them on. Ids
increase within a table, so nothing appended is missed or read twice; at most MAX_NEW per table are read
at a time (the rest come next time).

Severities: an audit entry that failed (`error`) is an alert, a refused one a warning; a canary verdict
change to drifting or failing is an alert; a rollout aborting (or aborted) is an alert, a paused one a
warning; everything else is info.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fleetctl.canary.types import condition_label
from fleetctl.controller.audit import ERROR, NOOP, REFUSED
from fleetctl.controller.models import AuditEvent, CanaryEvent, RolloutEvent
from fleetctl.controller.watch_contract import FleetEventView

MAX_NEW = 1000  # per table and read
ALARMED = frozenset({"drifting", "failing"})
ROLLOUT_ALERTS = frozenset({"aborting", "aborted"})
ROLLOUT_WARNINGS = frozenset({"paused"})
Row = AuditEvent | CanaryEvent | RolloutEvent
SOURCES: tuple[tuple[str, type[Row]], ...] = (("audit", AuditEvent), ("canary", CanaryEvent), ("rollout", RolloutEvent))


@dataclass(frozen=True)
class EventCursors:
    """The last id read from each table (0: none yet)."""

    audit: int = 0
    canary: int = 0
    rollout: int = 0


def latest(session: Session, limit: int) -> tuple[list[dict[str, Any]], EventCursors]:
    """The newest `limit` events over all tables, oldest first, and cursors at each table's end."""
    rows: list[tuple[str, Row]] = []
    for source, model in SOURCES:
        if limit > 0:
            found = session.execute(select(model).order_by(model.id.desc()).limit(limit)).scalars()
            rows.extend((source, row) for row in found)
    ends = {source: session.execute(select(func.max(model.id))).scalar() or 0 for source, model in SOURCES}
    newest = sorted(rows, key=_order)[-limit:] if limit > 0 else []
    return [event_view(source, row) for source, row in newest], EventCursors(**ends)


def since(session: Session, cursors: EventCursors) -> tuple[list[dict[str, Any]], EventCursors]:
    """Events appended after `cursors`, oldest first, and the cursors past them."""
    rows: list[tuple[str, Row]] = []
    moved = {}
    for source, model in SOURCES:
        after = getattr(cursors, source)
        found = list(session.execute(select(model).where(model.id > after).order_by(model.id).limit(MAX_NEW)).scalars())
        rows.extend((source, row) for row in found)
        moved[source] = found[-1].id if found else after
    return [event_view(source, row) for source, row in sorted(rows, key=_order)], EventCursors(**moved)


def _order(item: tuple[str, Row]) -> tuple[datetime, str, int]:
    source, row = item
    return row.at, source, row.id


def event_view(source: str, row: Any) -> dict[str, Any]:
    build = {"audit": audit_event, "canary": canary_event, "rollout": rollout_event}[source]
    return build(row).model_dump(mode="json")


def audit_event(row: AuditEvent) -> FleetEventView:
    return FleetEventView(id=f"audit:{row.id}", at=row.at.isoformat(), source="audit", severity=audit_severity(row.result),
                          subject=row.target, message=audit_message(row), actor=row.actor)


def audit_severity(result: str) -> str:
    return "alert" if result == ERROR else "warning" if result == REFUSED else "info"


def audit_message(row: AuditEvent) -> str:
    """'node.cordon n1', then how it ended unless it changed something, then why: 'node.cordon n1 refused
    (409 version_conflict): maintenance'."""
    text = f"{row.action} {row.target}".strip()
    if row.result in (REFUSED, ERROR):
        text += f" {row.result} ({' '.join(_present([str(row.status), row.code]))})"
    elif row.result == NOOP:
        text += " (no change)"
    return f"{text}: {row.reason}" if row.reason else text


def canary_event(row: CanaryEvent) -> FleetEventView:
    subject = row.class_ref or f"{row.model} production"
    return FleetEventView(id=f"canary:{row.id}", at=row.at.isoformat(), source="canary",
                          severity="alert" if row.verdict_to in ALARMED else "info",
                          subject=subject, message=f"{condition_label(row.condition)}: {row.message}")


def rollout_event(row: RolloutEvent) -> FleetEventView:
    severity = "alert" if row.event in ROLLOUT_ALERTS else "warning" if row.event in ROLLOUT_WARNINGS else "info"
    return FleetEventView(id=f"rollout:{row.id}", at=row.at.isoformat(), source="rollout", severity=severity,
                          subject=f"rollouts/{row.rollout_id}", message=f"{row.event}: {row.message}", actor=row.actor)


def _present(parts: Iterable[str | None]) -> list[str]:
    return [part for part in parts if part]
