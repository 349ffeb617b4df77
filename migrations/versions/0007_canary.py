"""The quality canary: golden_sets, canary_references, canary_probes (append-only), canary_streams (each
stream's test state and verdict), canary_events (verdict changes) and drills.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "golden_sets",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("version", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.Column("created_by", sa.String(length=65), nullable=False),
    )
    op.create_index("ix_golden_sets_model", "golden_sets", ["model"])
    op.create_table(
        "canary_references",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("golden_set", sa.String(length=63), nullable=False),
        sa.Column("golden_version", sa.Integer(), nullable=False),
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("correctness_digest", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        _timestamp("recorded_at"),
        sa.Column("recorded_by", sa.String(length=65), nullable=False),
    )
    op.create_index("ix_canary_references_model", "canary_references", ["model"])
    op.create_table(
        "canary_probes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _timestamp("at"),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("class_ref", sa.String(length=80), nullable=True),
        sa.Column("engine", sa.String(length=63), nullable=True),
        sa.Column("condition", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=True),
        sa.Column("prompt_id", sa.String(length=63), nullable=False),
        sa.Column("reference_id", sa.Integer(), nullable=True),
        sa.Column("score", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_canary_probes_at", "canary_probes", ["at"])
    op.create_index("ix_canary_probes_model", "canary_probes", ["model"])
    op.create_table(
        "canary_streams",
        sa.Column("key", sa.String(length=400), primary_key=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("class_ref", sa.String(length=80), nullable=True),
        sa.Column("condition", sa.Integer(), nullable=True),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        _timestamp("since", nullable=True),
        sa.Column("state", sa.JSON(), nullable=False),
        _timestamp("updated_at"),
    )
    op.create_index("ix_canary_streams_model", "canary_streams", ["model"])
    op.create_table(
        "canary_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _timestamp("at"),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("class_ref", sa.String(length=80), nullable=True),
        sa.Column("condition", sa.Integer(), nullable=True),
        sa.Column("verdict_from", sa.String(length=16), nullable=False),
        sa.Column("verdict_to", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=True),
    )
    op.create_index("ix_canary_events_at", "canary_events", ["at"])
    op.create_index("ix_canary_events_model", "canary_events", ["model"])
    op.create_table(
        "drills",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("target_ref", sa.String(length=80), nullable=True),
        sa.Column("fraction", sa.Float(), nullable=True),
        sa.Column("engine", sa.String(length=63), nullable=True),
        sa.Column("fault", sa.String(length=32), nullable=True),
        _timestamp("started_at"),
        _timestamp("ends_at"),
        _timestamp("stopped_at", nullable=True),
        sa.Column("stopped_by", sa.String(length=65), nullable=True),
        sa.Column("created_by", sa.String(length=65), nullable=False),
    )
    op.create_index("ix_drills_model", "drills", ["model"])


def downgrade() -> None:
    op.drop_index("ix_drills_model", "drills")
    op.drop_table("drills")
    op.drop_index("ix_canary_events_model", "canary_events")
    op.drop_index("ix_canary_events_at", "canary_events")
    op.drop_table("canary_events")
    op.drop_index("ix_canary_streams_model", "canary_streams")
    op.drop_table("canary_streams")
    op.drop_index("ix_canary_probes_model", "canary_probes")
    op.drop_index("ix_canary_probes_at", "canary_probes")
    op.drop_table("canary_probes")
    op.drop_index("ix_canary_references_model", "canary_references")
    op.drop_table("canary_references")
    op.drop_index("ix_golden_sets_model", "golden_sets")
    op.drop_table("golden_sets")
