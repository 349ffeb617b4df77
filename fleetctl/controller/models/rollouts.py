"""Rollouts: the spec and the machine's persisted state, and their append-only history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fleetctl.controller.models.base import NAME, Base, Versioned


class Rollout(Versioned, Base):
    """A phased move of a model's traffic from class revision A (`from_ref`) to B (`to_ref`).

    `spec` is the RolloutSpec as written (aliases), with `from` resolved; `state` is RolloutState.to_json().
    `active_model` is the model while the rollout is not terminal and NULL once it is: being UNIQUE, it
    keeps one rollout per model at a time even when two controllers race to start one. Writes are
    compare-and-set on `version` (an operator command and the reconciler never overwrite each other)."""

    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    from_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    to_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    spec: Mapped[dict[str, Any]]
    state: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(String(16), index=True)
    active_model: Mapped[str | None] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    updated_at: Mapped[datetime]


class RolloutEvent(Base):
    """Append-only: one line of a rollout's history (started, step, weights, paused, aborted, ...)."""

    __tablename__ = "rollout_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout_id: Mapped[int] = mapped_column(ForeignKey("rollouts.id"), index=True)
    at: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(NAME + 2))
    event: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
