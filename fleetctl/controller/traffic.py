"""Traffic policies: for each model, weights over its class revisions (read by the gateway via routing).

Validated before stored: every class ref exists and serves the model, and some weight is positive.
The correctness guard on splits (and rollouts that declare differences) is a later step.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.classes import resolve_ref
from fleetctl.controller.models import TrafficPolicy
from fleetctl.errors import ValidationFailed


def set_traffic(session: Session, model: str, weights: dict[str, float], actor: str, now: datetime) -> bool:
    """Store the model's weights; False if they were already exactly these."""
    if not any(w > 0 for w in weights.values()):
        raise ValidationFailed("weights: at least one weight must be positive", field="weights")
    for ref in weights:
        revision = resolve_ref(session, ref, field=f"weights.{ref}")
        if revision.ref != ref:
            raise ValidationFailed(f"weights.{ref}: name a revision (NAME@rN), e.g. {revision.ref}", field=f"weights.{ref}")
        if revision.spec["model"] != model:
            raise ValidationFailed(f"weights.{ref}: serves {revision.spec['model']!r}, not {model!r}", field=f"weights.{ref}")
    row = session.get(TrafficPolicy, model)
    if row is not None and row.weights == weights:
        return False
    if row is None:
        session.add(TrafficPolicy(model=model, weights=dict(weights), updated_at=now, updated_by=actor))
    else:
        row.weights, row.updated_at, row.updated_by = dict(weights), now, actor
    return True


def list_traffic(session: Session) -> dict[str, Any]:
    rows = session.execute(select(TrafficPolicy).order_by(TrafficPolicy.model)).scalars()
    return {row.model: {"weights": row.weights, "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by} for row in rows}
