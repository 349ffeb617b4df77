"""Feature flags and kill switches: named scalar values, served to gateways in the routing table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import FeatureFlag
from fleetctl.controller.versions import check_version


def set_flag(session: Session, name: str, value: bool | int | float | str, actor: str, now: datetime,
             expected_version: int | None = None) -> tuple[bool, int]:
    """(changed, version): changed is False if the flag already had exactly this value. With
    `expected_version` (If-Match) the stored flag must be at that version."""
    row = session.get(FeatureFlag, name)
    check_version(row, expected_version, f"flag {name!r}")
    if row is not None and row.value == value and type(row.value) is type(value):
        return False, row.version
    if row is None:
        row = FeatureFlag(name=name, value=value, updated_at=now, updated_by=actor)
        session.add(row)
    else:
        row.value, row.updated_at, row.updated_by = value, now, actor
    session.flush()  # assigns (or advances) the version
    return True, row.version


def list_flags(session: Session) -> dict[str, Any]:
    rows = session.execute(select(FeatureFlag).order_by(FeatureFlag.name)).scalars()
    return {row.name: {"value": row.value, "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by,
                       "version": row.version} for row in rows}
