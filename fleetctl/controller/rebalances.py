"""P:D rebalances in the store: preview, start (validated whole, nothing stored on a refusal), list, get,
stop, history, and what the machine observes of the revision it rebalances.

A rebalance works on one class revision of one model: the only one with engines. Start refuses, before
anything is written:
- an unknown model (no deployment): 404 naming `model`;
- a model whose deployments use two revisions (a rollout's leftovers or a split): 409 `several_revisions`;
- a mixed-only model without `mixed` (how many stay mixed): 422 naming `mixed`;
- a target with another engine count, a role below its floor, or a negative count: 422 naming the role
  (flips.check_target);
- a frozen fleet: 409 `frozen`; a rollout of the model that is not terminal: 409 `rollout_in_progress`;
- another rebalance that is not terminal: 409 `rebalance_in_progress` naming it. The unique `active`
  column makes that hold between two controllers racing to start one.
A target equal to the current ratio stores nothing: the preview says there is nothing to do.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from fleetctl.controller import flags, pd_settings
from fleetctl.controller.models import Assignment, Deployment, Engine, RebalanceEvent, RebalanceRow, Rollout
from fleetctl.controller.rebalance.state import TERMINAL, RebalanceSpec, RebalanceState
from fleetctl.controller.traffic import ready_engine_rows
from fleetctl.errors import Conflict, NotFound, ValidationFailed
from fleetctl.pd.flips import ROLE_ORDER, EngineNow, TargetRefused, check_target, preview
from fleetctl.pd.planner import EngineProfile, Ratio

ACTIVE = "pd"
CONTROLLER = "controller"
DEFAULT_FLOOR = 1


@dataclass(frozen=True)
class Target:
    prefill: int
    decode: int
    mixed: int | None = None  # None: as many as now
    floor_prefill: int = DEFAULT_FLOOR
    floor_decode: int = DEFAULT_FLOOR


@dataclass(frozen=True)
class Revision:
    """The one class revision of a model that has deployments, and its ratio."""

    model: str
    class_ref: str
    ratio: Ratio
    deployments: tuple[Deployment, ...]


# --- what the model looks like ---

def model_revision(session: Session, model: str) -> Revision:
    deployments = tuple(session.execute(select(Deployment).where(Deployment.model == model)
                                        .order_by(Deployment.name)).scalars())
    if not deployments:
        raise NotFound(f"model: {model!r} has no deployment", field="model")
    refs = serving_refs(deployments)
    if len(refs) > 1:
        raise Conflict(f"model: {model!r} runs {len(refs)} class revisions ({', '.join(refs)}); a rebalance works on "
                       "one: finish the rollout or the split first", code="several_revisions", field="model")
    mine = tuple(d for d in deployments if d.class_ref == refs[0])
    return Revision(model, refs[0], deployed_ratio(mine), mine)


def serving_refs(deployments: Iterable[Deployment]) -> list[str]:
    """The class revisions a model's deployments ask engines of (all of them when none asks for any)."""
    rows = list(deployments)
    return sorted({d.class_ref for d in rows if d.replicas > 0} or {d.class_ref for d in rows})


def deployed_ratio(deployments: Iterable[Deployment]) -> Ratio:
    """Engines per role the deployments ask for."""
    counts: dict[str, int] = defaultdict(int)
    for d in deployments:
        counts[d.role] += d.replicas
    return ratio_of(counts)


def ratio_of(by_role: Mapping[str, int]) -> Ratio:
    return Ratio(by_role.get("prefill", 0), by_role.get("decode", 0), by_role.get("mixed", 0))


def engines_now(session: Session, model: str, class_ref: str) -> tuple[EngineNow, ...]:
    """The revision's engines that are not draining, with what a flip of each would cost."""
    serving = {(node, name) for node, name, _ref, _role in ready_engine_rows(session, [class_ref])}
    metrics = {(e.node, e.name): e.metrics or {} for e in session.execute(
        select(Engine).where(Engine.class_ref == class_ref)).scalars()}
    rows = session.execute(select(Assignment).where(Assignment.model == model, Assignment.class_ref == class_ref,
                                                    Assignment.drain.is_(False))
                           .order_by(Assignment.name)).scalars()
    engines = []
    for a in rows:
        m = metrics.get((a.node, a.name), {})
        in_flight = int(m.get("num_requests_running", 0) + m.get("num_requests_waiting", 0))
        engines.append(EngineNow(a.name, a.role, (a.node, a.name) in serving, in_flight,
                                 float(m.get("kv_cache_usage_perc", 0.0)), a.node, a.deployment))
    return tuple(engines)


# --- preview and start ---

def resolve_target(revision: Revision, target: Target) -> Ratio:
    current = revision.ratio
    if current.prefill + current.decode == 0 and target.mixed is None:
        raise ValidationFailed(
            f"mixed: {revision.model!r} has no prefill or decode engines ({current.mixed} mixed); say how many stay "
            "mixed with --mixed K to turn the others into prefill and decode engines", field="mixed")
    wanted = Ratio(target.prefill, target.decode, current.mixed if target.mixed is None else target.mixed)
    try:
        check_target(current, wanted, target.floor_prefill, target.floor_decode)
    except TargetRefused as exc:
        raise ValidationFailed(str(exc), field=exc.field) from None
    return wanted


def preview_view(session: Session, model: str, target: Target) -> dict[str, Any]:
    """What `start` would do, stored nowhere: the flips in order and the capacity before and after."""
    revision = model_revision(session, model)
    wanted = resolve_target(revision, target)
    flips = preview(engines_now(session, model, revision.class_ref), revision.ratio, wanted)
    return {
        "model": model, "class_ref": revision.class_ref, "current": ratio_json(revision.ratio),
        "target": ratio_json(wanted), "changes": wanted != revision.ratio,
        "flips": [{"engine": f.engine, "from_role": f.from_role, "to_role": f.to_role, "cost": round(f.cost, 2)}
                  for f in flips],
        "effect": expected_effect(revision.ratio, wanted, pd_settings.profile_for(session, revision.class_ref)),
    }


def expected_effect(current: Ratio, target: Ratio, profile: EngineProfile) -> list[str]:
    """One line per role that changes: its capacity before and after, from the engine profile."""
    lines = []
    if current.prefill != target.prefill:
        lines.append(f"prefill capacity {current.prefill} x {profile.prefill_tokens_per_s:.0f} tok/s = "
                     f"{current.prefill * profile.prefill_tokens_per_s:.0f} -> "
                     f"{target.prefill * profile.prefill_tokens_per_s:.0f} tok/s ({profile.source} profile)")
    if current.decode != target.decode:
        lines.append(f"decode slots {current.decode} x {profile.decode_slots:.0f} = "
                     f"{current.decode * profile.decode_slots:.0f} -> {target.decode * profile.decode_slots:.0f} "
                     f"({profile.source} profile)")
    if current.mixed != target.mixed:
        lines.append(f"mixed engines {current.mixed} -> {target.mixed}")
    if (current.prefill and current.decode) != (target.prefill and target.decode):
        lines.append("the model is served P/D from the first flip that gives it a prefill and a decode engine"
                     if target.prefill and target.decode else "the model is served whole (mixed) once a role is empty")
    return lines


def start(session: Session, model: str, target: Target, slo: Mapping[str, float], reason: str | None, actor: str,
          now: datetime) -> RebalanceRow:
    revision = model_revision(session, model)
    wanted = resolve_target(revision, target)
    if wanted == revision.ratio:
        raise Conflict(f"{model!r} is already at {wanted.text()}", code="already_at_target", field="prefill")
    if flags.flag_value(session, "freeze", now):
        raise Conflict("the fleet is frozen: no rebalance starts until `fleetctl breakglass unfreeze`", code="frozen")
    rollout = session.execute(select(Rollout.id).where(Rollout.active_model == model)).scalar()
    if rollout is not None:
        raise Conflict(f"rollout {rollout} of {model!r} is running: rebalance once it is done",
                       code="rollout_in_progress")
    running = active(session)
    if running is not None:
        raise Conflict(f"rebalance {running.id} of {running.model!r} is running: one rebalance at a time",
                       code="rebalance_in_progress")
    spec = RebalanceSpec(model, revision.class_ref, wanted, **slo)
    row = RebalanceRow(model=model, class_ref=revision.class_ref, spec=spec.to_json(),
                       state=RebalanceState(updated_at=now).to_json(), phase="baseline", active=ACTIVE,
                       reason=reason, created_at=now, created_by=actor, updated_at=now)
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:
        raise Conflict("another rebalance started meanwhile: one rebalance at a time",
                       code="rebalance_in_progress") from None
    record_event(session, row.id, actor, "created",
                 f"{revision.ratio.text()} -> {wanted.text()}" + (f": {reason}" if reason else ""), now)
    return row


# --- reading and commands ---

def active(session: Session) -> RebalanceRow | None:
    return session.execute(select(RebalanceRow).where(RebalanceRow.active == ACTIVE)).scalar()


def get(session: Session, rebalance_id: int) -> RebalanceRow:
    row = session.get(RebalanceRow, rebalance_id)
    if row is None:
        raise NotFound(f"no rebalance {rebalance_id}", field="id")
    return row


def list_rows(session: Session, model: str | None = None, limit: int = 50) -> list[RebalanceRow]:
    query = select(RebalanceRow).order_by(RebalanceRow.id.desc()).limit(limit)
    if model is not None:
        query = query.where(RebalanceRow.model == model)
    return list(session.execute(query).scalars())


def request_stop(session: Session, rebalance_id: int, actor: str, now: datetime) -> RebalanceRow:
    """Ask the machine to stop after the flip in progress (so the ratio stays whole)."""
    row = get(session, rebalance_id)
    if row.phase in TERMINAL:
        raise Conflict(f"rebalance {rebalance_id} is already {row.phase}", code="rebalance_done", field="id")
    state = RebalanceState.from_json(row.state)
    if state.stop_requested:
        return row
    written = session.execute(
        update(RebalanceRow).where(RebalanceRow.id == row.id, RebalanceRow.version == row.version)
        .values(state=state.but(stop_requested=actor, updated_at=now).to_json(), updated_at=now,
                version=row.version + 1).execution_options(synchronize_session=False)).rowcount
    if written != 1:
        raise Conflict(f"rebalance {rebalance_id} changed meanwhile; try again", code="concurrent_change")
    record_event(session, row.id, actor, "stop_requested", "stops after the flip in progress", now)
    session.expire(row)
    return get(session, rebalance_id)


def record_event(session: Session, rebalance_id: int, actor: str, event: str, message: str, now: datetime) -> None:
    session.add(RebalanceEvent(rebalance_id=rebalance_id, at=now, actor=actor[:65], event=event[:32], message=message))


def events(session: Session, rebalance_id: int) -> list[RebalanceEvent]:
    return list(session.execute(select(RebalanceEvent).where(RebalanceEvent.rebalance_id == rebalance_id)
                                .order_by(RebalanceEvent.id)).scalars())


def rebalance_view(session: Session, row: RebalanceRow, with_events: bool = True) -> dict[str, Any]:
    spec, state = RebalanceSpec.from_json(row.spec), RebalanceState.from_json(row.state)
    view: dict[str, Any] = {
        "id": row.id, "model": row.model, "class_ref": row.class_ref, "phase": row.phase,
        "target": ratio_json(spec.target), "paused_by": state.paused_by, "message": state.message,
        "reason": row.reason, "created_at": row.created_at.isoformat(), "created_by": row.created_by,
        "updated_at": row.updated_at.isoformat(), "stop_requested": state.stop_requested,
        "slo": {"ttft_p90_s": spec.ttft_slo_s, "itl_p90_s": spec.itl_slo_s},
        "baseline": {"ttft_p90_s": state.baseline_ttft_p90_s, "itl_p90_s": state.baseline_itl_p90_s},
        "flips": [{"engine": f.engine, "from_role": f.from_role, "to_role": f.to_role, "phase": f.phase,
                   "started_at": f.started_at.isoformat(),
                   "done_at": f.done_at.isoformat() if f.done_at else None,
                   "ttft_p90_s": f.ttft_p90_s, "itl_p90_s": f.itl_p90_s} for f in state.flips],
        "version": row.version,
    }
    if with_events:
        view["events"] = [{"at": e.at.isoformat(), "actor": e.actor, "event": e.event, "message": e.message}
                          for e in events(session, row.id)]
    return view


def ratio_json(ratio: Ratio) -> dict[str, int]:
    return {role: getattr(ratio, role) for role in ROLE_ORDER}
