"""P:D: rebalances and their history, the planner's settings per model, and engine profiles."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fleetctl.controller.models.base import NAME, Base, Versioned


class RebalanceRow(Versioned, Base):
    """A P:D rebalance: one class revision's engines flipped between roles, one at a time, to a target ratio.

    `spec` is rebalance.state.RebalanceSpec, `state` RebalanceState.to_json(). `active` is "pd" while the
    rebalance is not terminal and NULL once it is: being UNIQUE, it keeps one rebalance in the fleet at a
    time, even between two controllers racing to start one. Writes are compare-and-set on `version`."""

    __tablename__ = "rebalances"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    spec: Mapped[dict[str, Any]]
    state: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(String(16), index=True)
    active: Mapped[str | None] = mapped_column(String(8), unique=True)
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    updated_at: Mapped[datetime]


class RebalanceEvent(Base):
    """Append-only: one line of a rebalance's history (started, baseline, flip_started, flip_done, ...)."""

    __tablename__ = "rebalance_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rebalance_id: Mapped[int] = mapped_column(ForeignKey("rebalances.id"), index=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(NAME + 2))
    event: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class PdModelSettings(Versioned, Base):
    """The P:D planner's settings for one model (a model without a row has the defaults: mode off)."""

    __tablename__ = "pd_models"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))  # off | advisory | auto
    floor_prefill: Mapped[int] = mapped_column(Integer)
    floor_decode: Mapped[int] = mapped_column(Integer)
    ttft_slo_s: Mapped[float] = mapped_column(Float)
    itl_slo_s: Mapped[float] = mapped_column(Float)
    headroom: Mapped[float] = mapped_column(Float)
    cooldown_s: Mapped[float] = mapped_column(Float)
    dwell_s: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME + 2))


class PdProfile(Base):
    """What one engine of a class revision does within the SLOs, as `fleetctl pd profile` measured it:
    prefill tokens per second, decode slots and the ITL measured at them, with the sweep's points in `detail`."""

    __tablename__ = "pd_profiles"

    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"), primary_key=True)
    prefill_tokens_per_s: Mapped[float] = mapped_column(Float)
    decode_slots: Mapped[float] = mapped_column(Float)
    decode_itl_s: Mapped[float | None] = mapped_column(Float)  # None: not measured (the planner uses the ITL SLO)
    detail: Mapped[dict[str, Any]]
    measured_at: Mapped[datetime]
    measured_by: Mapped[str] = mapped_column(String(NAME + 2))
