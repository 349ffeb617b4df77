"""`gateways.hash_mismatch`: the engines a gateway found hashing prefixes with another seed than its own, from
its latest report (NULL: a gateway that does not check, or has not reported since); `adopted_engines`: engines
fleetctl did not launch, registered by `fleetctl engine adopt`.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.add_column("gateways", sa.Column("hash_mismatch", sa.JSON(), nullable=True))
    op.create_table(
        "adopted_engines",
        sa.Column("name", sa.String(length=75), primary_key=True),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("kv_events_endpoint", sa.String(length=500), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("reported", sa.JSON(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        _timestamp("adopted_at"),
        sa.Column("adopted_by", sa.String(length=65), nullable=False),
        _timestamp("checked_at"),
        _timestamp("draining_since", nullable=True),
    )


def downgrade() -> None:
    op.drop_table("adopted_engines")
    with op.batch_alter_table("gateways") as batch:
        batch.drop_column("hash_mismatch")
