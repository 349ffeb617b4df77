"""Flag overrides: feature_flags rows gain a reason and an expiry (TTL), and keys long enough for a
per-model flag (`NAME:MODEL`). The two flags stored under earlier names are renamed to the catalog's:
`canary-probes` -> `canary_probes`, `pd_disabled:MODEL` (true) -> `pd_disaggregation:MODEL` (false).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("feature_flags") as batch:
        batch.alter_column("name", type_=sa.String(264), existing_type=sa.String(63))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    flags = sa.table("feature_flags", sa.column("name", sa.String), sa.column("value", sa.JSON))
    bind = op.get_bind()
    for name, value in bind.execute(sa.select(flags.c.name, flags.c.value)).all():
        if name == "canary-probes":
            bind.execute(flags.update().where(flags.c.name == name).values(name="canary_probes"))
        elif name.startswith("pd_disabled:"):
            disabled = value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")
            bind.execute(flags.update().where(flags.c.name == name)
                         .values(name="pd_disaggregation:" + name.split(":", 1)[1], value=not disabled))


def downgrade() -> None:
    with op.batch_alter_table("feature_flags") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("reason")
        batch.alter_column("name", type_=sa.String(63), existing_type=sa.String(264))
