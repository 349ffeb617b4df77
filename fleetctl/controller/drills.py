"""Canary drills: time-bound, audited, stoppable faults that prove the quality canary sees what it must.

- `misroute`: a fraction of a model's traffic goes to another class revision (the load-balancing change
  that once sent 16% of requests to differently configured servers). The stored traffic policy is not
  touched: the routing table the gateways read carries `misrouted_weights` of it while the drill is active
  (drill_effects.py, read by views.routing_content), so rollouts and `traffic get` keep showing the
  operator's weights.
- `plant`: one engine is restarted with a hidden numeric fault (engine.contract.faults). Its assignment
  carries `planted_fault` while the drill is active (drill_effects.planted_faults, read where heartbeat
  replies are built); the agent restarts the engine with the fault in its environment and reports a clean
  launch.

A drill is in effect while `stopped_at` is NULL: an operator stops it (`stop`), or the drill reconciler
(drill_reconciler.py) ends it at `ends_at` (`end_expired`: stopped_at = ends_at, stopped_by = 'expired').
The effect depends on the stored rows only, never on the clock, so the routing table's digest (and so its
generation, routing_generation.py) changes exactly when a drill starts or stops. Whoever starts or stops a
misroute stamps the routing generation afterwards (the API routes, the reconciler), as for traffic changes;
a plant advances the engine's node generation, as a drain does, so the agent sees it on its next beat.

At most one drill per model is in effect. Starts take the routing counter's row lock first, so two
concurrent starts for one model are serialised and the second sees the first (PostgreSQL's read committed
would otherwise let both pass the check).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from engine.contract import RUNNING_STATES
from engine.contract.faults import FAULTS
from fleetctl.controller import audit, routing_generation, traffic
from fleetctl.controller.drill_effects import MISROUTE, PLANT
from fleetctl.controller.drill_effects import misrouted_weights as misrouted_weights  # the misroute's pure part
from fleetctl.controller.models import Assignment, Deployment, Drill, Engine, Node
from fleetctl.errors import Conflict, NotFound, ValidationFailed

EXPIRED = "expired"  # stopped_by of a drill that ran its course
CONTROLLER = "controller"  # the audit actor of what the controller does by itself
START, STOP = "drill.start", "drill.stop"  # audit actions
MAX_FRACTION = 0.5
MAX_DURATION_S = 4 * 3600.0
DEFAULT_DURATION_S = 20 * 60.0
RECENT = 50  # ended drills listed after the active ones


# --- starting ---

def start_misroute(session: Session, model: str, to_ref: str, fraction: float, duration_s: float | None,
                   actor: str, now: datetime) -> Drill:
    """Store a misroute of `fraction` of `model`'s traffic to `to_ref` for `duration_s` (default 20 min).
    Refused, naming the field, when the fraction or duration is out of bounds, when `to_ref` does not serve
    the model (no such revision; another model's; not deployed or no ready engine: 409) or already has all
    of its traffic (409), or when the model already has a drill in effect (409)."""
    fraction = check_fraction(fraction)
    seconds = check_duration(duration_s)
    routing_generation.lock(session)
    weights = traffic.traffic_view(session, model)["weights"]  # NotFound (field model) for an unknown model
    check_target(session, model, to_ref, weights)
    check_no_drill(session, model, now)
    return _insert(session, Drill(kind=MISROUTE, model=model, target_ref=to_ref, fraction=fraction), seconds,
                   actor, now)


def start_plant(session: Session, engine: str, fault: str, duration_s: float | None, actor: str,
                now: datetime) -> Drill:
    """Store a plant of `fault` in `engine` for `duration_s` (default 20 min) and advance its node's
    generation. Refused, naming the field, when the fault is not one of FAULTS, when the engine is not
    assigned (404) or not running (starting or ready, not draining: 409), or when its model already has a
    drill in effect (409)."""
    if fault not in FAULTS:
        raise ValidationFailed(f"fault: {fault!r} is not a planted fault; one of {', '.join(sorted(FAULTS))}",
                               field="fault")
    seconds = check_duration(duration_s)
    routing_generation.lock(session)
    assignment = running_assignment(session, engine)
    check_no_drill(session, assignment.model, now)
    drill = _insert(session, Drill(kind=PLANT, model=assignment.model, engine=engine, fault=fault), seconds, actor, now)
    _advance_node(session, assignment.node)
    return drill


def check_fraction(fraction: float) -> float:
    if not (math.isfinite(fraction) and 0.0 < fraction <= MAX_FRACTION):
        raise ValidationFailed(f"fraction: must be more than 0 and at most {MAX_FRACTION:g}, not {fraction:g}",
                               field="fraction")
    return float(fraction)


def check_duration(duration_s: float | None) -> float:
    seconds = DEFAULT_DURATION_S if duration_s is None else float(duration_s)
    if not (math.isfinite(seconds) and 0.0 < seconds <= MAX_DURATION_S):
        raise ValidationFailed(f"duration_s: must be more than 0 s and at most {MAX_DURATION_S:g} s (4h), "
                               f"not {seconds:g}", field="duration_s")
    return seconds


def check_target(session: Session, model: str, to_ref: str, weights: Mapping[str, float]) -> None:
    spec = traffic.known_specs(session, [to_ref]).get(to_ref)
    if spec is None:
        raise NotFound(f"to: no class revision {to_ref!r}", field="to")
    if spec.model != model:
        raise ValidationFailed(f"to: {to_ref} serves {spec.model!r}, not {model!r}", field="to")
    deployed = session.execute(select(Deployment.name).where(
        Deployment.model == model, Deployment.class_ref == to_ref, Deployment.replicas > 0)).first()
    if deployed is None:
        raise Conflict(f"to: {to_ref} is not deployed for {model!r}; deploy it first", code="not_deployed", field="to")
    if traffic.ready_engines(session, [to_ref]).get(to_ref, 0) == 0:
        raise Conflict(f"to: {to_ref} has no ready engine", code="no_ready_engines", field="to")
    if not any(w > 0 for ref, w in weights.items() if ref != to_ref):
        raise Conflict(f"to: {to_ref} already carries all of {model!r}'s traffic; there is nothing to misroute",
                       code="nothing_to_misroute", field="to")


def running_assignment(session: Session, engine: str) -> Assignment:
    assignment = session.get(Assignment, engine)
    if assignment is None:
        raise NotFound(f"engine: no assigned engine {engine!r}", field="engine")
    state = session.execute(select(Engine.state).where(
        Engine.node == assignment.node, Engine.name == engine)).scalar_one_or_none()
    if assignment.drain or state not in RUNNING_STATES:
        why = "being drained" if assignment.drain else f"{state or 'not reported'}"
        raise Conflict(f"engine: {engine} is not running ({why}); a fault is planted in a running engine",
                       code="engine_not_running", field="engine")
    return assignment


def check_no_drill(session: Session, model: str, now: datetime) -> None:
    """One drill per model: a drill of the model that has run its course but is not yet ended is ended
    here first (as the reconciler would), so it does not refuse the new one."""
    current = session.execute(select(Drill).where(Drill.model == model, Drill.stopped_at.is_(None))).scalars().all()
    end_expired(session, [d for d in current if d.ends_at <= now], now)
    active = [d for d in current if d.ends_at > now]
    if active:
        raise Conflict(f"model: {model!r} already has drill {active[0].id} in effect ({describe(active[0])}); "
                       "stop it first", code="drill_in_progress", field="model")


def _insert(session: Session, drill: Drill, seconds: float, actor: str, now: datetime) -> Drill:
    drill.started_at, drill.ends_at, drill.created_by = now, now + timedelta(seconds=seconds), actor
    session.add(drill)
    session.flush()  # assigns the id
    return drill


def _advance_node(session: Session, node: str) -> None:
    """The node's agent sees a changed assignment (a planted fault set or cleared) on its next beat."""
    session.execute(update(Node).where(Node.name == node).values(generation=Node.generation + 1)
                    .execution_options(synchronize_session=False))


# --- stopping and expiry ---

def stop(session: Session, drill_id: int | None, actor: str, now: datetime) -> list[Drill]:
    """End one drill (`drill_id`; NotFound naming `id` if there is none) or, with None, every drill in
    effect. Returns the drills this call ended (none when they had ended already)."""
    if drill_id is not None:
        drill = session.get(Drill, drill_id)
        if drill is None:
            raise NotFound(f"id: no drill {drill_id}", field="id")
        targets = [drill] if drill.stopped_at is None else []
    else:
        targets = active_drills(session)
    return [d for d in targets if _end(session, d, stopped_at=now, stopped_by=actor)]


def end_expired(session: Session, drills: Iterable[Drill], now: datetime) -> list[Drill]:
    """End drills that ran their course (stopped_at = ends_at, stopped_by 'expired'), each audited at `now`
    with actor `controller`. Returns those this call ended (a concurrent stop may have ended one first)."""
    ended = []
    for drill in drills:
        if _end(session, drill, stopped_at=drill.ends_at, stopped_by=EXPIRED):
            record_audit(session, drill, CONTROLLER, STOP, f"{describe(drill)}: expired at {drill.ends_at.isoformat()}",
                         now)
            ended.append(drill)
    return ended


def _end(session: Session, drill: Drill, stopped_at: datetime, stopped_by: str) -> bool:
    """Compare-and-set: only a drill still in effect is ended, so a stop and the expiry never both end it."""
    ended = session.execute(
        update(Drill).where(Drill.id == drill.id, Drill.stopped_at.is_(None))
        .values(stopped_at=stopped_at, stopped_by=stopped_by).execution_options(synchronize_session=False)
    ).rowcount
    if not ended:
        return False
    session.refresh(drill)
    if drill.kind == PLANT and drill.engine is not None:
        node = session.execute(select(Assignment.node).where(Assignment.name == drill.engine)).scalar_one_or_none()
        if node is not None:
            _advance_node(session, node)
    return True


def record_audit(session: Session, drill: Drill, actor: str, action: str, reason: str, now: datetime) -> None:
    """An audit event of the controller's own (the API records its calls through deps.Change)."""
    payload = json.dumps(drill_view(drill, now), sort_keys=True).encode()
    audit.record(session, audit.AuditRecord(
        actor=actor, action=action, target=f"drills/{drill.id}", reason=reason,
        payload_digest=audit.payload_digest(payload), result=audit.OK, status=200), now)


# --- reading ---

def active_drills(session: Session) -> list[Drill]:
    """Drills in effect (not stopped; one past its end is in effect until the reconciler ends it), oldest first."""
    return list(session.execute(select(Drill).where(Drill.stopped_at.is_(None)).order_by(Drill.id)).scalars())


def list_drills(session: Session, recent: int = RECENT) -> list[Drill]:
    """The drills in effect (oldest first), then the last `recent` ended ones (newest first)."""
    ended = session.execute(select(Drill).where(Drill.stopped_at.is_not(None))
                            .order_by(Drill.id.desc()).limit(recent)).scalars()
    return [*active_drills(session), *ended]


def misroute_of(session: Session, model: str) -> Drill | None:
    return session.execute(select(Drill).where(Drill.kind == MISROUTE, Drill.model == model,
                                               Drill.stopped_at.is_(None)).order_by(Drill.id)).scalars().first()


def drill_view(drill: Drill, now: datetime) -> dict[str, Any]:
    active = drill.stopped_at is None
    return {
        "id": drill.id, "kind": drill.kind, "model": drill.model, "to_ref": drill.target_ref,
        "fraction": drill.fraction, "engine": drill.engine, "fault": drill.fault,
        "started_at": drill.started_at.isoformat(), "ends_at": drill.ends_at.isoformat(),
        "stopped_at": drill.stopped_at.isoformat() if drill.stopped_at else None, "stopped_by": drill.stopped_by,
        "created_by": drill.created_by, "active": active,
        "remaining_s": round(max((drill.ends_at - now).total_seconds(), 0.0), 1) if active else None,
        "description": describe(drill),
    }


def describe(drill: Drill) -> str:
    """One line: 'drill 3: misroute 15% of tiny's traffic to tiny@r2 for 20m'."""
    minutes = (drill.ends_at - drill.started_at).total_seconds() / 60
    span = f"{minutes:g}m" if minutes >= 1 else f"{minutes * 60:g}s"
    if drill.kind == MISROUTE:
        return (f"drill {drill.id}: misroute {(drill.fraction or 0) * 100:g}% of {drill.model}'s traffic "
                f"to {drill.target_ref} for {span}")
    return f"drill {drill.id}: plant {drill.fault} in engine {drill.engine} ({drill.model}) for {span}"
