"""Traffic guard and gateway acknowledgements: the routing generation counter (routing_state, one row),
gateways' reports (gateways), and audit_events.detail (what a guard explicitly let through).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _timestamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    routing_state = op.create_table(
        "routing_state",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
    )
    op.bulk_insert(routing_state, [{"id": 1, "generation": 0, "digest": ""}])
    op.create_table(
        "gateways",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("url", sa.String(length=500), nullable=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("table_age_s", sa.Float(), nullable=False),
        sa.Column("refresh_interval_s", sa.Float(), nullable=False),
        _timestamp("first_seen_at"),
        _timestamp("last_seen_at"),
        sa.Column("reported_by", sa.String(length=65), nullable=False),
    )
    op.add_column("audit_events", sa.Column("detail", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("detail")
    op.drop_table("gateways")
    op.drop_table("routing_state")
