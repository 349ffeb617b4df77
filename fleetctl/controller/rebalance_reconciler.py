"""The rebalance reconciler: steps the active rebalance's role-flip machine on the leader
(reconcile/protocol.py).

One run:
1. `snapshot`: the rebalance that is not terminal (at most one), its spec, stored state and row version, and
   what its class revision looks like (`observe`; reads only);
2. `decide` (pure): `machine.step(spec, state, observations, now)`;
3. `apply`, in a savepoint: the new state under a compare-and-set on the row version (an operator's stop that
   landed meanwhile wins; the rebalance is decided again at the next run), then the actions in order:
   - DrainEngine: the engine's assignment is marked drained and its deployment scaled to one fewer, in the
     same write, so placement drains it (never kills it) and does not replace it;
   - ScaleRole: the revision's deployment in the new role scaled up; created, with the old deployment's
     placement, when the revision has none in that role (named `<old deployment>-<role>`);
   - Record: a rebalance_events row and an audit event.
Everything it changes is audited with actor `controller` and the rebalance named in the reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fleetctl.controller import audit, flags, nodes
from fleetctl.controller.gateways import served_by_gateway
from fleetctl.controller.models import NAME, Assignment, Deployment, RebalanceRow, Rollout
from fleetctl.controller.reconcile.protocol import Result
from fleetctl.controller.rebalance import machine
from fleetctl.controller.rebalance.state import (
    TERMINAL, Action, DrainEngine, Observations, RebalanceSpec, RebalanceState, Record, ScaleRole, Transition,
)
from fleetctl.controller.rebalances import ACTIVE, CONTROLLER, deployed_ratio, engines_now, ratio_of, record_event
from fleetctl.controller.rollout_observations import routing_acknowledged
from fleetctl.controller.traffic import ready_engines_by_role

log = logging.getLogger(__name__)

REBALANCES = "rebalances"


@dataclass(frozen=True)
class RebalanceItem:
    id: int
    version: int
    spec: RebalanceSpec
    state: RebalanceState
    observations: Observations


@dataclass(frozen=True)
class RebalanceDecision:
    item: RebalanceItem | None
    transition: Transition | None


@dataclass
class RebalanceReport:
    advanced: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # lost the compare-and-set
    deployments: list[str] = field(default_factory=list)  # scaled, created, or an engine drained out of


class RebalanceReconciler:
    name = REBALANCES

    def __init__(self, interval_s: float, heard_since: datetime | None = None):
        self.interval_s = interval_s
        self.heard_since = heard_since  # as the rollout reconciler's: gateways heard before it are awaited

    def snapshot(self, session: Session, now: datetime) -> RebalanceItem | None:
        row = session.execute(select(RebalanceRow).where(RebalanceRow.active == ACTIVE)).scalar()
        if row is None:
            return None
        spec = RebalanceSpec.from_json(row.spec)
        return RebalanceItem(row.id, row.version, spec, RebalanceState.from_json(row.state),
                             observe(session, spec, now, self.heard_since))

    def decide(self, snapshot: RebalanceItem | None, now: datetime) -> RebalanceDecision:
        if snapshot is None:
            return RebalanceDecision(None, None)
        return RebalanceDecision(snapshot, machine.step(snapshot.spec, snapshot.state, snapshot.observations, now))

    def apply(self, session: Session, decision: RebalanceDecision, now: datetime) -> Result[RebalanceReport]:
        report = RebalanceReport()
        item, transition = decision.item, decision.transition
        if item is None or transition is None:
            return Result(report)
        if transition.actions or transition.state.but(updated_at=None) != item.state.but(updated_at=None):
            with session.begin_nested():
                if not compare_and_set(session, item, transition.state, now):
                    report.skipped.append(item.id)
                    return Result(report, requeue_after=0.0)
                for action in transition.actions:
                    report.deployments += apply_action(session, item, action, now)
            report.advanced.append(item.id)
        return Result(report, changed=bool(report.advanced), requeue_after=transition.requeue_after_s,
                      wake=bool(report.deployments))


def observe(session: Session, spec: RebalanceSpec, now: datetime, heard_since: datetime | None = None) -> Observations:
    ref = spec.class_ref
    assignments = list(session.execute(select(Assignment).where(Assignment.model == spec.model,
                                                                Assignment.class_ref == ref)).scalars())
    deployments = list(session.execute(select(Deployment).where(Deployment.model == spec.model,
                                                                Deployment.class_ref == ref)).scalars())
    ready = {role: n for (r, role), n in ready_engines_by_role(session, [ref]).items() if r == ref}
    rollout = session.execute(select(Rollout.id).where(Rollout.active_model == spec.model)).scalar()
    return Observations(
        engines=engines_now(session, spec.model, ref),
        running=frozenset(a.name for a in assignments),
        drained=frozenset(a.name for a in assignments if a.drain),
        desired=deployed_ratio(deployments),
        ready=ratio_of(ready),
        replicas={d.name: d.replicas for d in deployments},
        acknowledged=routing_acknowledged(session, now, heard_since),
        served=served_by_gateway(session, [ref]),
        frozen=bool(flags.flag_value(session, "freeze", now)),
        rollout=f"rollout {rollout}" if rollout is not None else None,
    )


def compare_and_set(session: Session, item: RebalanceItem, state: RebalanceState, now: datetime) -> bool:
    written = session.execute(
        update(RebalanceRow).where(RebalanceRow.id == item.id, RebalanceRow.version == item.version)
        .values(state=state.to_json(), phase=state.phase, updated_at=now, version=item.version + 1,
                active=None if state.phase in TERMINAL else ACTIVE)
        .execution_options(synchronize_session=False)
    ).rowcount
    return written == 1


def apply_action(session: Session, item: RebalanceItem, action: Action, now: datetime) -> list[str]:
    """Apply one action; returns the deployments it changed."""
    if isinstance(action, Record):
        record_event(session, item.id, CONTROLLER, action.event, action.message, now)
        _audit(session, item, f"rebalance.{action.event}", f"rebalances/{item.id}", action, now)
        return []
    if isinstance(action, DrainEngine):
        changed = drain_engine(session, action, now)
        kind = "drain_engine"
    else:
        assert isinstance(action, ScaleRole)
        changed = scale_role(session, item.spec, action, now)
        kind = "scale_role"
    for name in changed:
        _audit(session, item, f"rebalance.{kind}", name, action, now)
    return changed


def drain_engine(session: Session, action: DrainEngine, now: datetime) -> list[str]:
    changed = []
    if session.get(Assignment, action.engine) is not None and nodes.drain_engine(session, action.engine)[1]:
        changed.append(action.engine)
    deployment = session.get(Deployment, action.deployment)
    if deployment is not None and deployment.replicas != action.replicas:
        deployment.replicas, deployment.updated_at, deployment.updated_by = action.replicas, now, CONTROLLER
        changed.append(deployment.name)
    session.flush()
    return changed


def scale_role(session: Session, spec: RebalanceSpec, action: ScaleRole, now: datetime) -> list[str]:
    rows = session.execute(select(Deployment).where(Deployment.model == spec.model, Deployment.class_ref == spec.class_ref,
                                                    Deployment.role == action.role)
                           .order_by(Deployment.name)).scalars().all()
    if rows:
        target = rows[0]
        if target.replicas == action.replicas:
            return []
        target.replicas, target.updated_at, target.updated_by = action.replicas, now, CONTROLLER
    else:
        like = session.get(Deployment, action.like_deployment)
        target = Deployment(name=role_deployment_name(session, action.like_deployment, action.role), model=spec.model,
                            class_ref=spec.class_ref, role=action.role, replicas=action.replicas,
                            placement=dict(like.placement) if like is not None else {}, updated_at=now,
                            updated_by=CONTROLLER)
        session.add(target)
    session.flush()
    return [target.name]


def role_deployment_name(session: Session, like: str, role: str) -> str:
    """`<like>-<role>` (a trailing role word of `like` replaced), made unique and at most NAME long."""
    base = like
    for word in ("-mixed", "-prefill", "-decode"):
        base = base.removesuffix(word)
    name = f"{base}-{role}"
    if len(name) > NAME:
        name = f"{name[:NAME - 9].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    suffix = 2
    candidate = name
    while session.get(Deployment, candidate) is not None:
        candidate = f"{name[:NAME - 4]}-{suffix}"
        suffix += 1
    return candidate


def _audit(session: Session, item: RebalanceItem, action: str, target: str, what: Action, now: datetime) -> None:
    payload = json.dumps(asdict(what), sort_keys=True, default=str).encode()
    audit.record(session, audit.AuditRecord(
        actor=CONTROLLER, action=action, target=target,
        reason=f"rebalance {item.id} ({item.spec.model} -> {item.spec.target.text()})",
        payload_digest=audit.payload_digest(payload), result=audit.OK, status=200), now)
