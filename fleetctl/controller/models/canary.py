"""The quality canary (fleetctl/canary): golden sets, references, probes, streams, events and drills."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from fleetctl.controller.models.base import NAME, REF, Base


class GoldenSetRow(Base):
    """A golden set as uploaded (canary.types.GoldenSet as JSON), one row per (name, version); never changed."""

    __tablename__ = "golden_sets"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    digest: Mapped[str] = mapped_column(String(64))  # sha256 of the canonical JSON body
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))


class CanaryReference(Base):
    """A reference recorded from a class revision (canary.types.Reference as JSON). The newest per
    (model, class_ref) is the one in use; older ones stay for the history."""

    __tablename__ = "canary_references"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    golden_set: Mapped[str] = mapped_column(String(NAME))
    golden_version: Mapped[int] = mapped_column(Integer)
    class_ref: Mapped[str] = mapped_column(ForeignKey("class_revisions.ref"))
    correctness_digest: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]]
    recorded_at: Mapped[datetime]
    recorded_by: Mapped[str] = mapped_column(String(NAME + 2))


class CanaryProbe(Base):
    """Append-only: one scored probe (canary.types.ProbeRecord). Pruned by age, never edited."""

    __tablename__ = "canary_probes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # pinned | production
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    engine: Mapped[str | None] = mapped_column(String(NAME))
    condition: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(NAME))
    reference_id: Mapped[int | None] = mapped_column(Integer)
    score: Mapped[dict[str, Any] | None]
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


class CanaryStream(Base):
    """One stream's sequential-test state and verdict (canary.types.StreamState as JSON). `key` is
    StreamKey.label-like: 'model|kind|class_ref|condition' with '' for the production stream's None parts."""

    __tablename__ = "canary_streams"

    key: Mapped[str] = mapped_column(String(400), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    condition: Mapped[int | None] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(16))
    since: Mapped[datetime | None]
    state: Mapped[dict[str, Any]]
    updated_at: Mapped[datetime]


class CanaryEvent(Base):
    """Append-only: a verdict change (an alert when it turns drifting or failing, a recovery when it turns back)."""

    __tablename__ = "canary_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    model: Mapped[str] = mapped_column(String(200), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    class_ref: Mapped[str | None] = mapped_column(String(REF))
    condition: Mapped[int | None] = mapped_column(Integer)
    verdict_from: Mapped[str] = mapped_column(String(16))
    verdict_to: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any] | None]


class Drill(Base):
    """A time-bound fault drill: `misroute` (a fraction of a model's traffic to another class revision) or
    `plant` (one engine restarted with a hidden numeric fault). Active while stopped_at is NULL and
    ends_at is in the future."""

    __tablename__ = "drills"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # misroute | plant
    model: Mapped[str] = mapped_column(String(200), index=True)
    target_ref: Mapped[str | None] = mapped_column(String(REF))  # misroute: where the fraction goes
    fraction: Mapped[float | None] = mapped_column(Float)
    engine: Mapped[str | None] = mapped_column(String(NAME))  # plant: the engine
    fault: Mapped[str | None] = mapped_column(String(32))  # plant: engine.contract.faults name
    started_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    stopped_at: Mapped[datetime | None]
    stopped_by: Mapped[str | None] = mapped_column(String(NAME + 2))
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
