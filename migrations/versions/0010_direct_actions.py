"""Direct actions: what agents and gateways did on a break-glass credential without the controller, uploaded
when it is back, and how the operator resolved each (adopted, reverted).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "direct_actions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("source_kind", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        _timestamp("at"),
        _timestamp("received_at"),
        sa.Column("action", sa.String(length=200), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column("value", sa.JSON(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("open", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        _timestamp("resolved_at", nullable=True),
        sa.Column("resolved_by", sa.String(length=65), nullable=True),
        sa.UniqueConstraint("source_kind", "source", "seq"),
    )


def downgrade() -> None:
    op.drop_table("direct_actions")
