"""Gateways' per-revision serving counters: gateways.served holds the latest cumulative counters each
gateway reported, per class revision (what a rollout's analysis measures).

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("gateways", sa.Column("served", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateways") as batch:
        batch.drop_column("served")
