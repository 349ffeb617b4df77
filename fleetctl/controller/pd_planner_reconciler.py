"""The P:D planner reconciler: every model's recommendation, kept for `pd status` and acted on per mode.

One run:
1. `snapshot`: per model with deployments on a single class revision, its ratio, the readings of its
   engines' counters (fed to the load tracker, which predicts the arrival rate), its settings, its class
   revision's profile and what may hold a change back (freeze, a rollout, a rebalance, the `planner` flag,
   the last rebalance's time for the cooldown);
2. `decide` (pure): `planner.plan` per model;
3. `apply`: the recommendations are kept in memory (`PlannerMemory.latest`); a model in `advisory` mode
   gets an event (audit `pd.advice`) each time its recommended ratio changes; one in `auto` mode gets the
   rebalance the planner recommends, started as the operator's command would be (`rebalances.start`,
   actor `planner`), when nothing holds it back.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import audit, flags, pd_settings, rebalances
from fleetctl.controller.models import Assignment, Deployment, Engine, RebalanceRow, Rollout
from fleetctl.pd.load import LoadTracker, reading_of
from fleetctl.controller.reconcile.protocol import Result
from fleetctl.errors import FleetError
from fleetctl.pd.planner import EngineProfile, Gates, Load, PlannerSettings, Ratio, Recommendation, Snapshot, plan

log = logging.getLogger(__name__)

PD_PLANNER = "pd_planner"
PLANNER = "planner"  # the actor of what the planner does
IDLE = Load(arrival_rps=0.0, mean_input_tokens=0.0, mean_output_tokens=0.0)


@dataclass
class PlannerMemory:
    """What the planner keeps between runs, in this process: the load tracker and the latest advice."""

    tracker: LoadTracker = field(default_factory=LoadTracker)
    latest: dict[str, Recommendation] = field(default_factory=dict)
    measured: dict[str, bool] = field(default_factory=dict)  # model -> the load is measured (not yet: idle)
    advised: dict[str, Ratio] = field(default_factory=dict)  # model -> the last ratio advised (advisory mode)
    previous: dict[str, tuple[Ratio, datetime]] = field(default_factory=dict)  # model -> last recommended, since


@dataclass(frozen=True)
class ModelItem:
    model: str
    class_ref: str
    mode: str
    settings: PlannerSettings
    snapshot: Snapshot
    measured: bool


@dataclass(frozen=True)
class PlannerDecision:
    items: tuple[ModelItem, ...]
    recommendations: tuple[Recommendation, ...]


class PdPlannerReconciler:
    name = PD_PLANNER

    def __init__(self, interval_s: float, memory: PlannerMemory | None = None):
        self.interval_s = interval_s
        self.memory = memory if memory is not None else PlannerMemory()

    def snapshot(self, session: Session, now: datetime) -> tuple[ModelItem, ...]:
        return read_models(session, now, self.memory.tracker, self.memory.previous)

    def decide(self, snapshot: tuple[ModelItem, ...], now: datetime) -> PlannerDecision:
        return PlannerDecision(snapshot, tuple(plan(item.snapshot, item.settings, now) for item in snapshot))

    def apply(self, session: Session, decision: PlannerDecision, now: datetime) -> Result[list[str]]:
        acted: list[str] = []
        self.memory.latest = {r.model: r for r in decision.recommendations}
        self.memory.previous = {r.model: (r.recommended, r.since) for r in decision.recommendations if r.since}
        self.memory.measured = {item.model: item.measured for item in decision.items}
        self.memory.tracker.forget(self.memory.latest)
        for item, recommendation in zip(decision.items, decision.recommendations):
            if item.mode == "advisory" and item.measured:
                self._advise(session, item, recommendation, now)
            elif item.mode == "auto" and item.measured and recommendation.action == "rebalance":
                if self._rebalance(session, item, recommendation, now):
                    acted.append(item.model)
        return Result(acted, changed=bool(acted), wake=bool(acted))

    def _advise(self, session: Session, item: ModelItem, rec: Recommendation, now: datetime) -> None:
        last = self.memory.advised.get(item.model)
        if last == rec.recommended or (last is None and not rec.changes):
            return
        self.memory.advised[item.model] = rec.recommended
        audit.record(session, audit.AuditRecord(
            actor=PLANNER, action="pd.advice", target=item.model,
            reason=f"advisory: {rec.current.text()} -> {rec.recommended.text()}: " + "; ".join(rec.reasons),
            payload_digest=audit.payload_digest(json.dumps(rec.reasons).encode()), result=audit.NOOP, status=200,
            detail={"current": rec.current.text(), "recommended": rec.recommended.text(),
                    "blocked_by": rec.blocked_by}), now)

    def _rebalance(self, session: Session, item: ModelItem, rec: Recommendation, now: datetime) -> bool:
        target = rebalances.Target(rec.recommended.prefill, rec.recommended.decode, rec.recommended.mixed,
                                   item.settings.floor_prefill, item.settings.floor_decode)
        slo = {"ttft_slo_s": item.settings.ttft_slo_s, "itl_slo_s": item.settings.itl_slo_s}
        reason = f"planner (auto): {rec.current.text()} -> {rec.recommended.text()}: " + "; ".join(rec.reasons)
        try:
            with session.begin_nested():
                row = rebalances.start(session, item.model, target, slo, reason, PLANNER, now)
                audit.record(session, audit.AuditRecord(
                    actor=PLANNER, action="pd.rebalance", target=f"rebalances/{row.id}", reason=reason,
                    payload_digest=audit.payload_digest(reason.encode()), result=audit.OK, status=200), now)
        except FleetError as exc:
            log.info("planner: no rebalance of %s: %s", item.model, exc)
            return False
        return True


def read_models(session: Session, now: datetime, tracker: LoadTracker,
                previous: dict[str, tuple[Ratio, datetime]] | None = None) -> tuple[ModelItem, ...]:
    deployments = list(session.execute(select(Deployment).order_by(Deployment.model, Deployment.name)).scalars())
    by_model: dict[str, list[Deployment]] = {}
    for d in deployments:
        by_model.setdefault(d.model, []).append(d)
    frozen = bool(flags.flag_value(session, "freeze", now))
    enabled = bool(flags.flag_value(session, PLANNER, now))
    rollouts = {m: i for i, m in session.execute(select(Rollout.id, Rollout.active_model)
                                                 .where(Rollout.active_model.is_not(None))).tuples()}
    active = rebalances.active(session)
    items = []
    for model, rows in by_model.items():
        refs = rebalances.serving_refs(rows)
        if len(refs) != 1:
            continue  # a rollout or a split: the planner waits until one revision serves the model
        ref = refs[0]
        current = rebalances.deployed_ratio(d for d in rows if d.class_ref == ref)
        tracker.observe(model, reading_of(_engine_metrics(session, model, ref), now))
        loaded = tracker.load(model)
        model_settings = pd_settings.settings_for(session, model)
        gates = Gates(
            frozen=frozen,
            rollout=f"rollout {rollouts[model]}" if model in rollouts else None,
            rebalancing=f"rebalance {active.id} of {active.model}" if active is not None else None,
            planner_enabled=enabled,
            last_change_at=_last_rebalance_at(session, model),
            previous=(previous or {}).get(model),
        )
        profile: EngineProfile = pd_settings.profile_for(session, ref)
        snapshot = Snapshot(model, current, loaded[0] if loaded else IDLE, profile, gates)
        items.append(ModelItem(model, ref, model_settings.mode, model_settings.planner, snapshot, loaded is not None))
    return tuple(items)


def _engine_metrics(session: Session, model: str, ref: str) -> list[tuple[str, str, dict]]:
    assigned = {(a.node, a.name) for a in session.execute(
        select(Assignment).where(Assignment.model == model, Assignment.class_ref == ref)).scalars()}
    return [(e.name, e.role, e.metrics or {}) for e in session.execute(
        select(Engine).where(Engine.model == model, Engine.class_ref == ref).order_by(Engine.name)).scalars()
        if (e.node, e.name) in assigned]


def _last_rebalance_at(session: Session, model: str) -> datetime | None:
    return session.execute(select(RebalanceRow.updated_at).where(RebalanceRow.model == model)
                           .order_by(RebalanceRow.id.desc()).limit(1)).scalar()
