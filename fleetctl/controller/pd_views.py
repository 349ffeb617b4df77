"""What `fleetctl pd status|plan` shows per model: its ratio, its engines with their queues, the planner's
latest recommendation with its reasoning, and the rebalance under way."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller import pd_settings, rebalances
from fleetctl.controller.models import Assignment, Deployment, Engine
from fleetctl.controller.pd_planner_reconciler import PlannerMemory
from fleetctl.errors import NotFound
from fleetctl.pd.planner import Recommendation


def models_view(session: Session, now: datetime, memory: PlannerMemory, model: str | None = None) -> list[dict[str, Any]]:
    models = sorted({m for (m,) in session.execute(select(Deployment.model)).tuples()})
    if model is not None:
        if model not in models:
            raise NotFound(f"model: {model!r} has no deployment", field="model")
        models = [model]
    active = rebalances.active(session)
    return [model_view(session, name, memory, active if active is not None and active.model == name else None)
            for name in models]


def model_view(session: Session, model: str, memory: PlannerMemory, active) -> dict[str, Any]:
    rows = list(session.execute(select(Deployment).where(Deployment.model == model)).scalars())
    refs = rebalances.serving_refs(rows)
    ref = refs[0] if len(refs) == 1 else None
    settings = pd_settings.settings_for(session, model)
    return {
        "model": model, "class_ref": ref, "class_refs": refs,
        "ratio": rebalances.ratio_json(rebalances.deployed_ratio(d for d in rows if d.class_ref == ref)),
        "mode": settings.mode,
        "settings": asdict(settings.planner),
        "profile": asdict(pd_settings.profile_for(session, ref)),
        "engines": engines_view(session, model),
        "recommendation": recommendation_view(memory.latest.get(model), memory.measured.get(model, False)),
        "rebalance": rebalances.rebalance_view(session, active, with_events=False) if active is not None else None,
    }


def engines_view(session: Session, model: str) -> list[dict[str, Any]]:
    drained = {a.name: a.drain for a in session.execute(select(Assignment).where(Assignment.model == model)).scalars()}
    out = []
    for e in session.execute(select(Engine).where(Engine.model == model).order_by(Engine.name)).scalars():
        if e.name not in drained:
            continue
        m = e.metrics or {}
        out.append({"name": e.name, "node": e.node, "role": e.role, "state": e.state, "class_ref": e.class_ref,
                    "draining": drained[e.name], "running": int(m.get("num_requests_running", 0)),
                    "waiting": int(m.get("num_requests_waiting", 0)),
                    "kv_cache_usage": float(m.get("kv_cache_usage_perc", 0.0))})
    return out


def recommendation_view(rec: Recommendation | None, measured: bool) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "measured": measured,
        "current": rebalances.ratio_json(rec.current), "recommended": rebalances.ratio_json(rec.recommended),
        "action": rec.action, "changes": rec.changes, "blocked_by": rec.blocked_by,
        "prefill_need": round(rec.prefill_need, 3), "decode_need": round(rec.decode_need, 3),
        "ideal_prefill": round(rec.ideal_prefill, 3),
        "reasons": list(rec.reasons) if measured else ["no load measured yet (two readings 10 s apart are needed)"],
    }
