"""Feature flags and kill switches: named scalar values, served to gateways in the routing table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import FeatureFlag


def set_flag(session: Session, name: str, value: bool | int | float | str, actor: str, now: datetime) -> bool:
    """False if the flag already had exactly this value."""
    row = session.get(FeatureFlag, name)
    if row is not None and row.value == value and type(row.value) is type(value):
        return False
    if row is None:
        session.add(FeatureFlag(name=name, value=value, updated_at=now, updated_by=actor))
    else:
        row.value, row.updated_at, row.updated_by = value, now, actor
    return True


def list_flags(session: Session) -> dict[str, Any]:
    rows = session.execute(select(FeatureFlag).order_by(FeatureFlag.name)).scalars()
    return {row.name: {"value": row.value, "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by} for row in rows}
