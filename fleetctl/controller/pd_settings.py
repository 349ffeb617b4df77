"""The P:D planner's per-model settings (mode, floors, SLOs, headroom) and the engine profiles per class
revision, in the store.

Modes: `off` (recommendations are shown, nothing is recorded or done), `advisory` (each new recommendation
to change the ratio is recorded as an event and in the audit trail, so an operator can judge the planner
before trusting it), `auto` (the planner starts the rebalances it recommends, through the same role-flip
machine as `fleetctl pd rebalance`, within the floors, the freeze, the `planner` flag and its cooldown).
A class revision without a profile plans with DEFAULT_PROFILE, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.controller.models import ClassRevision, PdModelSettings, PdProfile
from fleetctl.errors import NotFound, ValidationFailed
from fleetctl.pd.planner import EngineProfile, PlannerSettings

Mode = Literal["off", "advisory", "auto"]
MODES: tuple[str, ...] = ("off", "advisory", "auto")
DEFAULT_MODE = "off"
# A SmolLM2-135M reference engine on one CPU core, rounded down (docs/pd.md shows how `pd profile` measures it).
DEFAULT_PROFILE = EngineProfile(prefill_tokens_per_s=400.0, decode_slots=4.0, source="default")


@dataclass(frozen=True)
class ModelSettings:
    mode: str
    planner: PlannerSettings
    version: int | None = None  # None: the defaults (no row)


def settings_for(session: Session, model: str) -> ModelSettings:
    row = session.get(PdModelSettings, model)
    if row is None:
        return ModelSettings(DEFAULT_MODE, PlannerSettings())
    return ModelSettings(row.mode, PlannerSettings(ttft_slo_s=row.ttft_slo_s, itl_slo_s=row.itl_slo_s,
                                                   headroom=row.headroom, floor_prefill=row.floor_prefill,
                                                   floor_decode=row.floor_decode, cooldown_s=row.cooldown_s,
                                                   dwell_s=row.dwell_s), row.version)


def all_settings(session: Session) -> dict[str, ModelSettings]:
    return {row.model: settings_for(session, row.model) for row in session.execute(select(PdModelSettings)).scalars()}


def set_settings(session: Session, model: str, changes: dict[str, Any], actor: str, now: datetime) -> ModelSettings:
    """Update the given fields (the others keep their values or defaults)."""
    if "mode" in changes and changes["mode"] not in MODES:
        raise ValidationFailed(f"mode: one of {', '.join(MODES)}, not {changes['mode']!r}", field="mode")
    current = settings_for(session, model)
    row = session.get(PdModelSettings, model)
    if row is None:
        p = current.planner
        row = PdModelSettings(model=model, mode=current.mode, floor_prefill=p.floor_prefill,
                              floor_decode=p.floor_decode, ttft_slo_s=p.ttft_slo_s, itl_slo_s=p.itl_slo_s,
                              headroom=p.headroom, cooldown_s=p.cooldown_s, dwell_s=p.dwell_s, updated_at=now,
                              updated_by=actor)
        session.add(row)
    for key, value in changes.items():
        setattr(row, key, value)
    row.updated_at, row.updated_by = now, actor
    session.flush()
    return settings_for(session, model)


def profile_for(session: Session, class_ref: str | None) -> EngineProfile:
    row = session.get(PdProfile, class_ref) if class_ref else None
    if row is None:
        return DEFAULT_PROFILE
    return EngineProfile(row.prefill_tokens_per_s, row.decode_slots,
                         f"profiled {row.measured_at.date().isoformat()} by {row.measured_by}", row.decode_itl_s)


def store_profile(session: Session, class_ref: str, prefill_tokens_per_s: float, decode_slots: float,
                  decode_itl_s: float | None, detail: dict[str, Any], actor: str, now: datetime) -> PdProfile:
    if session.get(ClassRevision, class_ref) is None:
        raise NotFound(f"class_ref: unknown replica class {class_ref!r}", field="class_ref")
    row = session.get(PdProfile, class_ref)
    if row is None:
        row = PdProfile(class_ref=class_ref)
        session.add(row)
    row.prefill_tokens_per_s, row.decode_slots, row.detail = prefill_tokens_per_s, decode_slots, detail
    row.decode_itl_s = decode_itl_s
    row.measured_at, row.measured_by = now, actor
    session.flush()
    return row


def profile_view(row: PdProfile) -> dict[str, Any]:
    return {"class_ref": row.class_ref, "prefill_tokens_per_s": row.prefill_tokens_per_s,
            "decode_slots": row.decode_slots, "decode_itl_s": row.decode_itl_s, "detail": row.detail,
            "measured_at": row.measured_at.isoformat(), "measured_by": row.measured_by}


def list_profiles(session: Session) -> list[PdProfile]:
    return list(session.execute(select(PdProfile).order_by(PdProfile.class_ref)).scalars())
