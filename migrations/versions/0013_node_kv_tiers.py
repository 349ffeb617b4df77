"""`nodes.kv_tiers`: the node's KV tiers as its agent last reported them (NULL: an agent that reports none, or
has not beaten since); `nodes.kv_flush`: an operator's flush of the node's tiers not yet carried out;
`nodes.kv_flushed`: the last one carried out.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS = ("kv_tiers", "kv_flush", "kv_flushed")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("nodes", sa.Column(name, sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
