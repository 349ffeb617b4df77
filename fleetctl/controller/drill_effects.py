"""What drills in effect do to what gateways and agents read: the misrouted weights of the routing table
(views.routing_content) and the planted faults of heartbeat assignments (nodes.py, heartbeats.py).

Starting, stopping and expiring drills is drills.py; this module only reads, and imports nothing of the
controller but its models, so the routing table and the heartbeat path can use it. A drill is in effect
while its `stopped_at` is NULL (see drills.py for why the clock plays no part here).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import Drill

MISROUTE, PLANT = "misroute", "plant"


@dataclass(frozen=True)
class Misroute:
    """A misroute in effect, as the routing table applies it."""

    drill_id: int
    to_ref: str
    fraction: float


def misrouted_weights(weights: Mapping[str, float], to_ref: str, fraction: float) -> dict[str, float]:
    """(1 - fraction) x the weights normalised to sum 1, plus `fraction` on `to_ref`. Zero-weight revisions
    stay (at 0) so they can still be pinned; weights with no positive sum send everything to `to_ref`."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    total = sum(w for w in weights.values() if w > 0)
    shares = {ref: (float(w) / total if total > 0 and w > 0 else 0.0) for ref, w in weights.items()}
    if total <= 0:
        return {**shares, to_ref: 1.0}
    misrouted = {ref: (1.0 - fraction) * share for ref, share in shares.items()}
    misrouted[to_ref] = misrouted.get(to_ref, 0.0) + fraction
    return misrouted


def misroutes(session: Session) -> dict[str, Misroute]:
    """model -> its misroute in effect."""
    rows = session.execute(select(Drill).where(Drill.kind == MISROUTE, Drill.stopped_at.is_(None))
                           .order_by(Drill.id)).scalars()
    return {d.model: Misroute(d.id, d.target_ref, float(d.fraction or 0.0)) for d in rows if d.target_ref}


def planted_faults(session: Session, engines: Iterable[str] | None = None) -> dict[str, str]:
    """engine name -> the fault a plant in effect asks it to run with (of `engines`, when given)."""
    query = select(Drill.engine, Drill.fault).where(Drill.kind == PLANT, Drill.stopped_at.is_(None))
    if engines is not None:
        query = query.where(Drill.engine.in_(list(engines)))
    return {engine: fault for engine, fault in session.execute(query).tuples() if engine and fault}
