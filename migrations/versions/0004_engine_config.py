"""Engine config as the engine side reports it: `engines.launched` (the command line and environment the
agent launched the engine with) and `engines.reported` (the engine's own account of its settings), read by
live config drift (fleetctl/controller/drift.py).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("engines", sa.Column("launched", sa.JSON(), nullable=True))
    op.add_column("engines", sa.Column("reported", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("reported")
        batch.drop_column("launched")
