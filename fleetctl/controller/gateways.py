"""Gateways' acknowledgements: each gateway reports the routing-table generation it applied after every
refresh; the controller keeps the last report per gateway. A gateway not heard from for more than
STALE_AFTER_INTERVALS of its refresh intervals is `stale` (gone, or cut off from the controller): it is
listed, but not waited for. A controller that has just started could not hear anyone while it was down,
so to the reconcilers a gateway last heard before the controller started is waited for until
RECONNECT_GRACE_S after that start (`is_awaited`): the gateway retries within its maximum backoff, and
until it reports, the controller cannot know which routing table it applies.

A report is an observation, like an agent heartbeat: not audited, and it changes nothing in the fleet.

Reports also carry `served`, the gateway's cumulative counters per class revision; the latest is kept per
gateway and read back by `served_by_gateway` for rollout analysis (rollout.window does the window math).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.contract import GatewayReport
from fleetctl.controller.models import Gateway
from fleetctl.controller.rollout.state import Histogram, ServedByGateway, ServedCounters

DEFAULT_REFRESH_INTERVAL_S = 2.0  # the gateway's own default (fleetctl/gateway/settings.py table_refresh_s)
STALE_AFTER_INTERVALS = 3
# the gateway's maximum backoff between table fetches (fleetctl/gateway/routing_table.py, 8 s), with a wide margin
# for a gateway built with a longer one
RECONNECT_GRACE_S = 40.0


def report(session: Session, body: GatewayReport, reporter: str, now: datetime) -> Gateway:
    row = session.get(Gateway, body.name)
    if row is None:
        row = Gateway(name=body.name, first_seen_at=now)
        session.add(row)
    row.url, row.generation, row.table_age_s = body.url, body.generation, body.table_age_s
    row.refresh_interval_s = body.refresh_interval_s or DEFAULT_REFRESH_INTERVAL_S
    row.last_seen_at, row.reported_by = now, reporter
    # the latest counters replace the last ones (they are cumulative); a gateway that sends none (an older
    # one) has none stored
    row.served = None if body.served is None else {ref: c.model_dump() for ref, c in body.served.items()}
    row.hash_mismatch = None if body.hash_mismatch is None else sorted(set(body.hash_mismatch))
    return row


def hash_mismatched(session: Session, now: datetime) -> set[str]:
    """The engines a live gateway flagged in its latest report (docs/vllm.md)."""
    flagged: set[str] = set()
    for row in session.execute(select(Gateway)).scalars():
        if row.hash_mismatch and not is_stale(max((now - row.last_seen_at).total_seconds(), 0.0),
                                              row.refresh_interval_s):
            flagged.update(row.hash_mismatch)
    return flagged


def served_by_gateway(session: Session, refs: Iterable[str] | None = None,
                      now: datetime | None = None) -> ServedByGateway:
    """Every gateway's latest counters: gateway name -> class_ref -> counters, only `refs` when given.

    Stale gateways are kept, with the counters of their last report: a window whose end reading still
    holds them adds nothing new for that gateway, which is what it served as far as anyone knows; dropping
    it would make its counters vanish from one reading and count again from zero when it came back.
    Gateways that never sent counters are left out. `now` filters nothing, since stale gateways stay in
    on purpose; callers pass their clock all the same."""
    wanted = set(refs) if refs is not None else None
    result: dict[str, dict[str, ServedCounters]] = {}
    for row in session.execute(select(Gateway).order_by(Gateway.name)).scalars():
        if row.served is None:
            continue
        result[row.name] = {ref: served_counters(data) for ref, data in row.served.items()
                            if wanted is None or ref in wanted}
    return result


def served_counters(data: Mapping[str, Any]) -> ServedCounters:
    """Stored counters (ServedCountersModel's dump) as the rollout machine's type."""
    return ServedCounters(int(data["requests"]), int(data["errors"]), int(data["rejections"]),
                          _histogram(data["ttft"]), _histogram(data["itl"]))


def _histogram(data: Mapping[str, Any]) -> Histogram:
    return Histogram(tuple(float(b) for b in data["bounds"]), tuple(int(c) for c in data["counts"]),
                     int(data["count"]), float(data["sum"]))


def list_gateways(session: Session, now: datetime) -> list[dict[str, Any]]:
    rows = session.execute(select(Gateway).order_by(Gateway.name)).scalars()
    return [gateway_view(row, now) for row in rows]


def is_stale(seen_ago_s: float, refresh_interval_s: float) -> bool:
    return seen_ago_s > STALE_AFTER_INTERVALS * refresh_interval_s


def is_awaited(last_seen_at: datetime, refresh_interval_s: float, now: datetime,
               heard_since: datetime | None = None) -> bool:
    """Whether a gateway's acknowledgement is waited for: it is not stale, or it was last heard before
    `heard_since` (when this controller started listening) and the reconnect grace since then is not over."""
    if not is_stale(max((now - last_seen_at).total_seconds(), 0.0), refresh_interval_s):
        return True
    return (heard_since is not None and last_seen_at < heard_since
            and (now - heard_since).total_seconds() <= RECONNECT_GRACE_S)


def gateway_view(row: Gateway, now: datetime) -> dict[str, Any]:
    seen_ago_s = max((now - row.last_seen_at).total_seconds(), 0.0)
    return {
        "name": row.name, "url": row.url, "generation": row.generation, "table_age_s": row.table_age_s,
        "refresh_interval_s": row.refresh_interval_s, "first_seen": row.first_seen_at.isoformat(),
        "last_seen": row.last_seen_at.isoformat(), "seen_ago_s": round(seen_ago_s, 3),
        "stale": is_stale(seen_ago_s, row.refresh_interval_s), "reported_by": row.reported_by,
        "hash_mismatch": list(row.hash_mismatch or ()),
    }
