"""Gateways' acknowledgements: each gateway reports the routing-table generation it applied after every
refresh; the controller keeps the last report per gateway. A gateway not heard from for more than
STALE_AFTER_INTERVALS of its refresh intervals is `stale` (gone, or cut off from the controller): it is
listed, but not waited for.

A report is an observation, like an agent heartbeat: not audited, and it changes nothing in the fleet.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.contract import GatewayReport
from fleetctl.controller.models import Gateway

DEFAULT_REFRESH_INTERVAL_S = 2.0  # the gateway's own default (fleetctl/gateway/settings.py table_refresh_s)
STALE_AFTER_INTERVALS = 3


def report(session: Session, body: GatewayReport, reporter: str, now: datetime) -> Gateway:
    row = session.get(Gateway, body.name)
    if row is None:
        row = Gateway(name=body.name, first_seen_at=now)
        session.add(row)
    row.url, row.generation, row.table_age_s = body.url, body.generation, body.table_age_s
    row.refresh_interval_s = body.refresh_interval_s or DEFAULT_REFRESH_INTERVAL_S
    row.last_seen_at, row.reported_by = now, reporter
    return row


def list_gateways(session: Session, now: datetime) -> list[dict[str, Any]]:
    rows = session.execute(select(Gateway).order_by(Gateway.name)).scalars()
    return [gateway_view(row, now) for row in rows]


def is_stale(seen_ago_s: float, refresh_interval_s: float) -> bool:
    return seen_ago_s > STALE_AFTER_INTERVALS * refresh_interval_s


def gateway_view(row: Gateway, now: datetime) -> dict[str, Any]:
    seen_ago_s = max((now - row.last_seen_at).total_seconds(), 0.0)
    return {
        "name": row.name, "url": row.url, "generation": row.generation, "table_age_s": row.table_age_s,
        "refresh_interval_s": row.refresh_interval_s, "first_seen": row.first_seen_at.isoformat(),
        "last_seen": row.last_seen_at.isoformat(), "seen_ago_s": round(seen_ago_s, 3),
        "stale": is_stale(seen_ago_s, row.refresh_interval_s), "reported_by": row.reported_by,
    }
