"""Rollouts: `rollouts` (spec, the state machine's persisted state, phase, and `active_model`, unique, so
one rollout per model runs at a time) and `rollout_events` (append-only history).

Revision ID: 0006
Revises: 0003
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("from_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("to_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("active_model", sa.String(length=200), nullable=True, unique=True),
        _timestamp("created_at"),
        sa.Column("created_by", sa.String(length=65), nullable=False),
        _timestamp("updated_at"),
        sa.Column("version", sa.Integer(), nullable=False, server_default="1"),
    )
    op.create_index("ix_rollouts_model", "rollouts", ["model"])
    op.create_index("ix_rollouts_phase", "rollouts", ["phase"])
    op.create_table(
        "rollout_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("rollout_id", sa.Integer(), sa.ForeignKey("rollouts.id"), nullable=False),
        _timestamp("at"),
        sa.Column("actor", sa.String(length=65), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_rollout_events_rollout_id", "rollout_events", ["rollout_id"])


def downgrade() -> None:
    op.drop_index("ix_rollout_events_rollout_id", "rollout_events")
    op.drop_table("rollout_events")
    op.drop_index("ix_rollouts_phase", "rollouts")
    op.drop_index("ix_rollouts_model", "rollouts")
    op.drop_table("rollouts")
