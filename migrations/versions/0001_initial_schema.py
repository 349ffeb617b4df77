"""Initial schema: nodes, engines, assignments, class revisions, deployments, traffic policies,
feature flags, audit events, API tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _timestamp(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False, unique=True),
        _timestamp("created_at"),
        sa.Column("created_by", sa.String(length=65), nullable=False),
        _timestamp("revoked_at", nullable=True),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        _timestamp("at"),
        sa.Column("actor", sa.String(length=65), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("target", sa.String(length=300), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("payload_digest", sa.String(length=64), nullable=False),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("code", sa.String(length=64), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
    )
    op.create_index("ix_audit_events_actor", "audit_events", ["actor"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_table(
        "class_revisions",
        sa.Column("ref", sa.String(length=80), primary_key=True),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        _timestamp("created_at"),
        sa.Column("created_by", sa.String(length=63), nullable=False),
        sa.UniqueConstraint("name", "digest"),
        sa.UniqueConstraint("name", "revision"),
    )
    op.create_index("ix_class_revisions_name", "class_revisions", ["name"])
    op.create_table(
        "feature_flags",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("value", sa.JSON(), nullable=False),
        _timestamp("updated_at"),
        sa.Column("updated_by", sa.String(length=63), nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("capacity_engines", sa.Integer(), nullable=False),
        sa.Column("capacity_kv_mib", sa.Integer(), nullable=False),
        sa.Column("agent_version", sa.String(length=100), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        _timestamp("registered_at"),
        _timestamp("last_heartbeat_at"),
        sa.Column("cut_off_s", sa.Float(), nullable=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("applied_generation", sa.Integer(), nullable=False),
    )
    op.create_table(
        "traffic_policies",
        sa.Column("model", sa.String(length=200), primary_key=True),
        sa.Column("weights", sa.JSON(), nullable=False),
        _timestamp("updated_at"),
        sa.Column("updated_by", sa.String(length=63), nullable=False),
    )
    op.create_table(
        "assignments",
        sa.Column("name", sa.String(length=75), primary_key=True),
        sa.Column("node", sa.String(length=63), sa.ForeignKey("nodes.name"), nullable=False),
        sa.Column("deployment", sa.String(length=63), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("drain", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_assignments_deployment", "assignments", ["deployment"])
    op.create_index("ix_assignments_node", "assignments", ["node"])
    op.create_table(
        "deployments",
        sa.Column("name", sa.String(length=63), primary_key=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("class_ref", sa.String(length=80), sa.ForeignKey("class_revisions.ref"), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        _timestamp("updated_at"),
        sa.Column("updated_by", sa.String(length=63), nullable=False),
    )
    op.create_table(
        "engines",
        sa.Column("node", sa.String(length=63), sa.ForeignKey("nodes.name"), primary_key=True),
        sa.Column("name", sa.String(length=75), primary_key=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("class_ref", sa.String(length=80), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("url", sa.String(length=500), nullable=True),
        sa.Column("kv_events_endpoint", sa.String(length=500), nullable=True),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("last_exit", sa.Text(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        _timestamp("updated_at"),
    )


def downgrade() -> None:
    for table in ("engines", "deployments", "assignments", "traffic_policies", "nodes", "feature_flags",
                  "class_revisions", "audit_events", "api_tokens"):
        op.drop_table(table)
