"""Operating the fleet: feature flags, the audit log, API tokens, and the break-glass direct actions
nodes upload."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fleetctl.controller.models.base import FLAG_KEY, NAME, Base, Versioned


class FeatureFlag(Versioned, Base):
    """An override of a catalog flag (fleetctl/flag_catalog.py): `name` is its key (`NAME` or `NAME:MODEL`).
    Without a row a flag has its default; a row past `expires_at` no longer counts, and the flag reconciler
    deletes it."""

    __tablename__ = "feature_flags"

    name: Mapped[str] = mapped_column(String(FLAG_KEY), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[datetime]
    updated_by: Mapped[str] = mapped_column(String(NAME))  # the owner: who set it last
    reason: Mapped[str | None] = mapped_column(Text)
    expires_at: Mapped[datetime | None]  # None: until unset


class AuditEvent(Base):
    """Append-only: written once per mutating call, never updated or deleted."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    actor: Mapped[str] = mapped_column(String(NAME + 2), index=True)
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str] = mapped_column(String(300))
    reason: Mapped[str | None] = mapped_column(Text)
    payload_digest: Mapped[str] = mapped_column(String(64))
    result: Mapped[str] = mapped_column(String(16))  # ok | noop | refused | error
    code: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    detail: Mapped[dict[str, Any] | None]  # what a guard let through, e.g. an allowed correctness change


class ApiToken(Base):
    """Only the sha256 of a token is stored. Revoked tokens stay (revoked_at set) for the audit trail."""

    __tablename__ = "api_tokens"

    name: Mapped[str] = mapped_column(String(NAME), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin | agent
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(NAME + 2))
    revoked_at: Mapped[datetime | None]


class DirectActionRow(Base):
    """A direct (break-glass) action an agent or a gateway did without the controller, as the node uploaded
    it (engine.contract.direct). `open`: the node still holds it in force (as of its last upload).
    `state`: pending (diverges from desired state until the operator adopts or reverts it), adopted,
    reverted, matches (desired state already agrees) or done (nothing left in force, e.g. a restart)."""

    __tablename__ = "direct_actions"
    __table_args__ = (UniqueConstraint("source_kind", "source", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    source_kind: Mapped[str] = mapped_column(String(16))  # agent | gateway
    source: Mapped[str] = mapped_column(String(200))
    seq: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime]  # when the node did it
    received_at: Mapped[datetime]
    action: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(300))
    value: Mapped[Any | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)
    open: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16))
    resolved_at: Mapped[datetime | None]
    resolved_by: Mapped[str | None] = mapped_column(String(NAME + 2))
