"""Traffic policies: for each model, weights over its class revisions (read by the gateway via routing).

`set_traffic` gathers a snapshot (the specs of the revisions named, ready engines per revision) and asks
the pure guard (traffic_guard.check_split) whether to store the weights; a refusal stores nothing. A split
over revisions whose correctness fields differ is stored only when the caller explicitly allowed it, and
the outcome says so (the API records it in the audit event).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.adoption import ADOPTED_NODE
from fleetctl.controller.adoption import READY as ADOPTED_READY
from fleetctl.controller.models import AdoptedEngine, Assignment, ClassRevision, Deployment, Engine, Node, TrafficPolicy
from fleetctl.controller.nodes import UP
from fleetctl.controller.versions import check_version
from fleetctl.controller.traffic_guard import (
    CONFLICT,
    CORRECTNESS_CHANGE_ALLOWED,
    CorrectnessDifference,
    Refusal,
    check_split,
    correctness_differences,
)
from fleetctl.errors import Conflict, FleetError, NotFound, ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec, correctness_fields, correctness_values

READY = "ready"


@dataclass(frozen=True)
class TrafficChange:
    """What `set_traffic` did: stored (changed) or not, and the correctness differences it was allowed."""

    changed: bool
    version: int  # of the stored policy, after this change
    allowed_differences: list[CorrectnessDifference] = field(default_factory=list)

    @property
    def audit_code(self) -> str | None:
        return CORRECTNESS_CHANGE_ALLOWED if self.allowed_differences else None

    @property
    def audit_detail(self) -> dict[str, Any] | None:
        if not self.allowed_differences:
            return None
        return {"allow_correctness_change": True,
                "correctness_differences": [d.to_json() for d in self.allowed_differences]}


def set_traffic(session: Session, model: str, weights: dict[str, float], allow_correctness_change: bool,
                actor: str, now: datetime, expected_version: int | None = None) -> TrafficChange:
    """Store the model's weights if the guard allows them; raise the first refusal otherwise. With
    `expected_version` (If-Match) the stored policy must be at that version."""
    specs = known_specs(session, weights)
    refusals = check_split(model, weights, specs, ready_engines(session, weights), allow_correctness_change)
    if refusals:
        raise refusal_error(refusals)
    allowed = correctness_differences(weights, specs)
    row = session.get(TrafficPolicy, model)
    check_version(row, expected_version, f"traffic policy of {model!r}")
    if row is not None and row.weights == weights:
        return TrafficChange(False, row.version, allowed)
    if row is None:
        row = TrafficPolicy(model=model, weights=dict(weights), updated_at=now, updated_by=actor)
        session.add(row)
    else:
        row.weights, row.updated_at, row.updated_by = dict(weights), now, actor
    session.flush()  # assigns (or advances) the version
    return TrafficChange(True, row.version, allowed)


def refusal_error(refusals: list[Refusal]) -> FleetError:
    """The first refusal as the API error (409 Conflict or 422 ValidationFailed); the rest are counted."""
    first = refusals[0]
    more = f" (and {len(refusals) - 1} more refusal(s))" if len(refusals) > 1 else ""
    cls = Conflict if first.status == CONFLICT else ValidationFailed
    return cls(first.message + more, code=first.code, field=first.field, status=first.status)


def known_specs(session: Session, refs: Iterable[str]) -> dict[str, ReplicaClassSpec]:
    rows = session.execute(select(ClassRevision).where(ClassRevision.ref.in_(list(refs)))).scalars()
    return {row.ref: ReplicaClassSpec.model_validate(row.spec) for row in rows}


def ready_engines(session: Session, refs: Iterable[str]) -> dict[str, int]:
    """Ready engines per class revision: reported `ready` by an agent whose node is up, and neither being
    drained (an engine on its way out is no place to send new traffic) nor cordoned."""
    counts: Counter[str] = Counter()
    for (ref, _role), count in ready_engines_by_role(session, refs).items():
        counts[ref] += count
    return dict(counts)


def ready_engine_rows(session: Session, refs: Iterable[str]) -> list[tuple[str, str, str, str]]:
    """(node, engine, class revision, role) of every ready engine of `refs` on an up node that is neither
    drained nor cordoned (the engines the gateways route new requests to)."""
    drained = set(session.execute(select(Assignment.node, Assignment.name)
                                  .where(Assignment.drain.is_(True) | Assignment.cordoned.is_(True))).tuples())
    rows = session.execute(
        select(Engine.node, Engine.name, Engine.class_ref, Engine.role)
        .join(Node, Node.name == Engine.node)
        .where(Engine.state == READY, Node.state == UP, Engine.class_ref.in_(list(refs)))
    ).tuples()
    # adopted engines (fleetctl engine adopt) run on no agent's node: ready while they answer their probe, and
    # not once released (`draining`): the gateways route them as they route the others
    adopted = session.execute(
        select(AdoptedEngine.name, AdoptedEngine.class_ref, AdoptedEngine.role)
        .where(AdoptedEngine.state == ADOPTED_READY, AdoptedEngine.class_ref.in_(list(refs)))
    ).tuples()
    found = [(node, name, ref, role) for node, name, ref, role in rows if (node, name) not in drained]
    return found + [(ADOPTED_NODE, name, ref, role) for name, ref, role in adopted]


def ready_engines_by_role(session: Session, refs: Iterable[str]) -> dict[tuple[str, str], int]:
    """Ready engines (as `ready_engines` counts them) per (class revision, role)."""
    return dict(Counter((ref, role) for _node, _name, ref, role in ready_engine_rows(session, refs)))


def list_traffic(session: Session) -> dict[str, Any]:
    rows = session.execute(select(TrafficPolicy).order_by(TrafficPolicy.model)).scalars()
    return {row.model: {"weights": row.weights, "updated_at": row.updated_at.isoformat(), "updated_by": row.updated_by,
                        "version": row.version}
            for row in rows}


def traffic_view(session: Session, model: str) -> dict[str, Any]:
    """The model's weights (its policy, else every deployed revision equally, as the routing table does)
    and, for each revision weighted or deployed, its ready engines and correctness fields."""
    row = session.get(TrafficPolicy, model)
    deployed = deployed_revisions(session, model)
    if row is None and not deployed:
        raise NotFound(f"model {model!r} has no traffic policy and no deployment", field="model")
    weights = dict(row.weights) if row is not None else {ref: 1.0 for ref in deployed}  # as model_weights
    refs = sorted(set(weights) | set(deployed))
    specs, ready = known_specs(session, refs), ready_engines(session, refs)
    total = sum(w for w in weights.values() if w > 0)
    return {
        "model": model, "source": "policy" if row is not None else "deployments", "weights": weights,
        "updated_at": row.updated_at.isoformat() if row is not None else None,
        "updated_by": row.updated_by if row is not None else None,
        "version": row.version if row is not None else None,
        "revisions": [_revision_view(ref, weights.get(ref, 0.0), total, ready.get(ref, 0), specs.get(ref)) for ref in refs],
    }


def deployed_revisions(session: Session, model: str) -> list[str]:
    """The revisions the model is served by without a policy (as the routing table counts them): those with
    a deployment of at least one replica, and those of its adopted engines."""
    deployed = session.execute(
        select(Deployment.class_ref).where(Deployment.model == model, Deployment.replicas > 0)).scalars()
    adopted = session.execute(select(AdoptedEngine.class_ref).where(AdoptedEngine.model == model)).scalars()
    return sorted(set(deployed) | set(adopted))


def model_weights(session: Session, model: str) -> dict[str, float]:
    """The model's weights as the routing table has them: its policy, else every deployed revision equally."""
    row = session.get(TrafficPolicy, model)
    if row is not None:
        return {ref: float(weight) for ref, weight in row.weights.items()}
    return {ref: 1.0 for ref in deployed_revisions(session, model)}


def _revision_view(ref: str, weight: float, total: float, ready: int, spec: ReplicaClassSpec | None) -> dict[str, Any]:
    values = correctness_values(spec) if spec is not None else {name: None for name in correctness_fields()}
    return {
        "ref": ref, "weight": weight, "share": round(weight / total, 4) if total > 0 and weight > 0 else 0.0,
        "ready_engines": ready, "correctness": values,
    }
