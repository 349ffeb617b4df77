"""Resource versions: deployments, traffic policies and feature flags carry `version`, advanced by every
change and checked by every update (optimistic concurrency; the API's ETag and If-Match).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

VERSIONED = ("deployments", "traffic_policies", "feature_flags")


def upgrade() -> None:
    for table in VERSIONED:
        op.add_column(table, sa.Column("version", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    for table in VERSIONED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("version")
