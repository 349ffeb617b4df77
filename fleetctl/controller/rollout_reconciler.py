"""The rollout reconciler: runs every active rollout's state machine on the leader (reconcile/protocol.py).

One run:
1. `snapshot`: every rollout that is not terminal, with its spec, stored state and row version, and what
   the fleet looks like for it (rollout_observations.observe; reads only);
2. `decide` (pure): `machine.step(spec, state, observations, now)` per rollout;
3. `apply`, per rollout whose state or actions changed, in a savepoint of its own: the new state is written
   with a compare-and-set on the row version read in step 1 (an operator command that landed meanwhile
   wins: the rollout is skipped and decided again at the next run), then its actions, in order:
   - SetWeights: traffic.set_traffic (the split guard applies; `allow_correctness_change` as the action
     says), then the routing generation is stamped so gateways can acknowledge it;
   - ScaleUp: B's deployments, one per role that A's deployments have, with A's placement and the
     action's replicas. An existing deployment of B in that role is scaled (so an undo scales A's original
     deployments back up); otherwise one is created, named `<A's deployment>-<B's name>-r<N>`
     (`managed_name`: at most 63 characters);
   - Drain: every deployment of the model on that revision scaled to 0; the placement reconciler then
     drains their engines (drained, never killed: placement.py);
   - Record: a rollout_events row and an audit event.
   Every change to the fleet is audited with actor `controller` and the rollout named in the reason.
   An action the store refuses (the split guard found no ready engine since the snapshot) rolls back that
   rollout's savepoint only; it is decided again at the next run.
The run asks to be requeued at the earliest `requeue_after_s` of the transitions.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from fleetctl.controller import audit, routing_generation, traffic, views
from fleetctl.controller.models import Deployment, NAME, Rollout
from fleetctl.controller.reconcile.protocol import Result
from fleetctl.controller.rollout import machine
from fleetctl.controller.rollout.spec import RolloutSpec
from fleetctl.controller.rollout.state import (
    TERMINAL,
    Action,
    Drain,
    Observations,
    Record,
    RolloutState,
    ScaleUp,
    SetWeights,
    Transition,
)
from fleetctl.controller.rollout_observations import observe, routing_acknowledged
from fleetctl.controller.rollouts import CONTROLLER, record_event
from fleetctl.errors import FleetError

log = logging.getLogger(__name__)

ROLLOUTS = "rollouts"


@dataclass(frozen=True)
class RolloutItem:
    """One active rollout as the snapshot read it."""

    id: int
    version: int  # of the row, for the compare-and-set
    model: str
    from_ref: str
    to_ref: str
    spec: RolloutSpec
    state: RolloutState
    observations: Observations
    a_replicas: int  # engines per role of A's deployments: B's when the spec does not say


@dataclass(frozen=True)
class RolloutSnapshot:
    rollouts: tuple[RolloutItem, ...]


@dataclass(frozen=True)
class RolloutStep:
    """One rollout's decision: the machine's transition, and whether there is anything to write."""

    item: RolloutItem
    transition: Transition
    changed: bool  # the state (its time stamp aside) differs, or there are actions


@dataclass(frozen=True)
class RolloutDecision:
    steps: tuple[RolloutStep, ...]


@dataclass
class RolloutReport:
    advanced: list[int] = field(default_factory=list)  # rollouts whose state was written
    skipped: list[int] = field(default_factory=list)  # lost the compare-and-set to a concurrent write
    failed: dict[int, str] = field(default_factory=dict)  # an action was refused; retried next run
    deployments: list[str] = field(default_factory=list)  # deployments scaled up, created or drained


class RolloutReconciler:
    name = ROLLOUTS

    def __init__(self, interval_s: float, heard_since: datetime | None = None):
        self.interval_s = interval_s  # seconds between runs when no transition asks for another time
        # when this controller started: a gateway last heard before it may only have been cut off while the
        # controller was down, so its acknowledgement is still waited for (gateways.is_awaited)
        self.heard_since = heard_since

    def snapshot(self, session: Session, now: datetime) -> RolloutSnapshot:
        return load_snapshot(session, now, self.heard_since)

    def decide(self, snapshot: RolloutSnapshot, now: datetime) -> RolloutDecision:
        return decide_rollouts(snapshot, now)

    def apply(self, session: Session, decision: RolloutDecision, now: datetime) -> Result[RolloutReport]:
        report = apply_rollouts(session, decision, now)
        # scaled deployments are placement's input: wake it now, not at its next interval
        return Result(report, changed=bool(report.advanced), requeue_after=requeue_after(decision),
                      wake=bool(report.deployments))


def load_snapshot(session: Session, now: datetime, heard_since: datetime | None = None) -> RolloutSnapshot:
    rows = list(session.execute(select(Rollout).where(Rollout.active_model.is_not(None)).order_by(Rollout.id)).scalars())
    if not rows:
        return RolloutSnapshot(())
    acknowledged = routing_acknowledged(session, now, heard_since)  # one routing-table build for every rollout
    return RolloutSnapshot(tuple(
        RolloutItem(row.id, row.version, row.model, row.from_ref, row.to_ref, RolloutSpec.model_validate(row.spec),
                    RolloutState.from_json(row.state),
                    observe(session, row.model, [row.from_ref, row.to_ref], now, acknowledged=acknowledged),
                    a_replicas(session, row.model, row.from_ref))
        for row in rows))


def a_replicas(session: Session, model: str, a_ref: str) -> int:
    """The most engines one of A's deployments asks for (at least 1: A may be drained already)."""
    counts = [d.replicas for d in _deployments(session, model) if d.class_ref == a_ref]
    return max([*counts, 1])


def decide_rollouts(snapshot: RolloutSnapshot, now: datetime) -> RolloutDecision:
    steps = []
    for item in snapshot.rollouts:
        transition = machine.step(item.spec, item.state, item.observations, now, item.from_ref, item.to_ref,
                                  item.a_replicas)
        changed = bool(transition.actions) or _content(transition.state) != _content(item.state)
        steps.append(RolloutStep(item, transition, changed))
    return RolloutDecision(tuple(steps))


def _content(state: RolloutState) -> dict[str, Any]:
    return {**state.to_json(), "updated_at": None}


def requeue_after(decision: RolloutDecision) -> float | None:
    times = [s.transition.requeue_after_s for s in decision.steps if s.transition.requeue_after_s is not None]
    return max(min(times), 0.0) if times else None


def apply_rollouts(session: Session, decision: RolloutDecision, now: datetime) -> RolloutReport:
    report = RolloutReport()
    for step in decision.steps:
        if not step.changed:
            continue
        try:
            with session.begin_nested():
                if not compare_and_set(session, step.item, step.transition.state, now):
                    report.skipped.append(step.item.id)
                    continue
                for action in step.transition.actions:
                    report.deployments += apply_action(session, step.item, action, now)
        except FleetError as exc:
            log.warning("rollout %d: %s; retrying at the next run", step.item.id, exc)
            report.failed[step.item.id] = str(exc)
            continue
        report.advanced.append(step.item.id)
    return report


def compare_and_set(session: Session, item: RolloutItem, state: RolloutState, now: datetime) -> bool:
    written = session.execute(
        update(Rollout).where(Rollout.id == item.id, Rollout.version == item.version)
        .values(state=state.to_json(), phase=state.phase, updated_at=now, version=item.version + 1,
                active_model=None if state.phase in TERMINAL else item.model)
        .execution_options(synchronize_session=False)
    ).rowcount
    return written == 1


def apply_action(session: Session, item: RolloutItem, action: Action, now: datetime) -> list[str]:
    """Apply one action; returns the deployments it changed."""
    if isinstance(action, SetWeights):
        set_weights(session, item, action, now)
        return []
    if isinstance(action, ScaleUp):
        kind, changed = "scale_up", scale_up(session, item.model, item.from_ref, action.class_ref, action.replicas, now)
    elif isinstance(action, Drain):
        kind, changed = "drain", drain(session, item.model, action.class_ref, now)
    else:
        assert isinstance(action, Record)
        record_event(session, item.id, CONTROLLER, action.event, action.message, now)
        _audit(session, item, f"rollout.{action.event}", f"rollouts/{item.id}", action, now)
        return []
    for name in changed:
        _audit(session, item, f"rollout.{kind}", name, action, now)
    return changed


def set_weights(session: Session, item: RolloutItem, action: SetWeights, now: datetime) -> None:
    change = traffic.set_traffic(session, item.model, dict(action.weights), action.allow_correctness_change,
                                 CONTROLLER, now)
    if change.changed:
        _audit(session, item, "rollout.set_weights", item.model, action, now, code=change.audit_code,
               detail=change.audit_detail)
        routing_generation.stamp(session, lambda: views.routing_content(session))


def scale_up(session: Session, model: str, a_ref: str, b_ref: str, replicas: int, now: datetime) -> list[str]:
    deployments = _deployments(session, model)
    first_of_role: dict[str, Deployment] = {}
    for d in deployments:
        if d.class_ref == a_ref:
            first_of_role.setdefault(d.role, d)
    changed = []
    for role, a in sorted(first_of_role.items()):
        b = next((d for d in deployments if d.class_ref == b_ref and d.role == role), None)
        if b is None:
            b = Deployment(name=managed_name(a.name, b_ref), model=model, class_ref=b_ref, role=role, replicas=replicas,
                           placement=dict(a.placement), updated_at=now, updated_by=CONTROLLER)
            session.add(b)
        elif b.replicas == replicas:
            continue
        else:
            b.replicas, b.updated_at, b.updated_by = replicas, now, CONTROLLER
        changed.append(b.name)
    session.flush()
    return changed


def drain(session: Session, model: str, ref: str, now: datetime) -> list[str]:
    changed = []
    for d in _deployments(session, model):
        if d.class_ref == ref and d.replicas > 0:
            d.replicas, d.updated_at, d.updated_by = 0, now, CONTROLLER
            changed.append(d.name)
    session.flush()
    return changed


def _deployments(session: Session, model: str) -> Sequence[Deployment]:
    return session.execute(select(Deployment).where(Deployment.model == model).order_by(Deployment.name)).scalars().all()


def managed_name(a_deployment: str, b_ref: str) -> str:
    """`<A's deployment>-<B's name>-r<N>`; when longer than a name may be, shortened with a digest of the
    full name in its place, so distinct pairs keep distinct names."""
    full = f"{a_deployment}-{b_ref.replace('@', '-')}"
    if len(full) <= NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[:NAME - 9].rstrip('-')}-{digest}"


def _audit(session: Session, item: RolloutItem, action: str, target: str, what: Action, now: datetime,
           code: str | None = None, detail: dict[str, Any] | None = None) -> None:
    payload = json.dumps(asdict(what), sort_keys=True, default=str).encode()
    audit.record(session, audit.AuditRecord(
        actor=CONTROLLER, action=action, target=target, reason=f"rollout {item.id} ({item.from_ref} -> {item.to_ref})",
        payload_digest=audit.payload_digest(payload), result=audit.OK, status=200, code=code, detail=detail), now)
