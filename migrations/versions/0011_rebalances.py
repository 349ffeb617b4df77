"""P:D: `rebalances` (spec and the role-flip machine's state; the unique `active` keeps one rebalance in
the fleet at a time), `rebalance_events` (append-only history), `pd_models` (the planner's settings per
model) and `pd_profiles` (an engine's measured prefill tokens/s, decode slots and the ITL at them, per class
revision).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "rebalances",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("active", sa.String(length=8), nullable=True, unique=True),
        sa.Column("reason", sa.Text(), nullable=True),
        _timestamp("created_at"),
        sa.Column("created_by", sa.String(length=65), nullable=False),
        _timestamp("updated_at"),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index("ix_rebalances_model", "rebalances", ["model"])
    op.create_index("ix_rebalances_phase", "rebalances", ["phase"])
    op.create_table(
        "rebalance_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("rebalance_id", sa.Integer(), sa.ForeignKey("rebalances.id"), nullable=False),
        _timestamp("at"),
        sa.Column("actor", sa.String(length=65), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_rebalance_events_rebalance_id", "rebalance_events", ["rebalance_id"])
    op.create_table(
        "pd_models",
        sa.Column("model", sa.String(length=200), primary_key=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("floor_prefill", sa.Integer(), nullable=False),
        sa.Column("floor_decode", sa.Integer(), nullable=False),
        sa.Column("ttft_slo_s", sa.Float(), nullable=False),
        sa.Column("itl_slo_s", sa.Float(), nullable=False),
        sa.Column("headroom", sa.Float(), nullable=False),
        sa.Column("cooldown_s", sa.Float(), nullable=False),
        sa.Column("dwell_s", sa.Float(), nullable=False),
        _timestamp("updated_at"),
        sa.Column("updated_by", sa.String(length=65), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_table(
        "pd_profiles",
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), primary_key=True),
        sa.Column("prefill_tokens_per_s", sa.Float(), nullable=False),
        sa.Column("decode_slots", sa.Float(), nullable=False),
        sa.Column("decode_itl_s", sa.Float(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        _timestamp("measured_at"),
        sa.Column("measured_by", sa.String(length=65), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pd_profiles")
    op.drop_table("pd_models")
    op.drop_index("ix_rebalance_events_rebalance_id", "rebalance_events")
    op.drop_table("rebalance_events")
    op.drop_index("ix_rebalances_phase", "rebalances")
    op.drop_index("ix_rebalances_model", "rebalances")
    op.drop_table("rebalances")
