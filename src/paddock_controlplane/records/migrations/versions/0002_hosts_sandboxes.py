"""Hosts and sandboxes.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
LIVE = "status NOT IN ('destroyed', 'failed')"


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("url", sa.String(300), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("free_mib", sa.Integer, nullable=False),
        sa.Column("total_mib", sa.Integer, nullable=False),
        sa.Column("vm_count", sa.Integer, nullable=False),
        sa.Column("rootfses", sa.JSON, nullable=False),
        sa.Column("buildable", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("last_heartbeat_at", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("host_id", sa.String(64), sa.ForeignKey("hosts.id"), nullable=True),
        sa.Column("ip", sa.String(64), nullable=True),
        sa.Column("shape", sa.String(40), nullable=False),
        sa.Column("rootfs", sa.String(100), nullable=False),
        sa.Column("vcpu", sa.Integer, nullable=False),
        sa.Column("mem_mib", sa.Integer, nullable=False),
        sa.Column("cpu_quota_pct", sa.Integer, nullable=True),
        sa.Column("disk_mib", sa.Integer, nullable=False),
        sa.Column("region", sa.String(8), nullable=False),
        sa.Column("spawn_ms", sa.Float, nullable=True),
        sa.Column("egress", sa.JSON, nullable=False),
        sa.Column("envs_sealed", sa.Text, nullable=True),
        sa.Column("env_keys", sa.JSON, nullable=False),
        sa.Column("ssh_pubkeys", sa.JSON, nullable=False),
        sa.Column("node_selector", sa.JSON, nullable=False),
        sa.Column("ingress_enabled", sa.Boolean, nullable=False),
        sa.Column("bandwidth_quota_bytes", sa.BigInteger, nullable=False),
        sa.Column("bandwidth_used_bytes", sa.BigInteger, nullable=False),
        sa.Column("bandwidth_ingress_bytes", sa.BigInteger, nullable=False),
        sa.Column("forked_from", sa.String(40), nullable=True),
        sa.Column("auto_pause_after_seconds", sa.Integer, nullable=True),
        sa.Column("status_reason", sa.String(300), nullable=True),
        sa.Column("oom_kills", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("running_at", TS, nullable=True),
        sa.Column("paused_at", TS, nullable=True),
        sa.Column("last_resumed_at", TS, nullable=True),
        sa.Column("destroyed_at", TS, nullable=True),
        sa.Column("last_activity_at", TS, nullable=True),
        sa.Column("billed_until", TS, nullable=True),
    )
    op.create_index(
        "uq_sandboxes_live_name",
        "sandboxes",
        ["user_id", "name"],
        unique=True,
        sqlite_where=sa.text(LIVE),
        postgresql_where=sa.text(LIVE),
    )
    op.create_index("ix_sandboxes_user_created", "sandboxes", ["user_id", "created_at", "id"])
    op.create_index("ix_sandboxes_status", "sandboxes", ["status"])


def downgrade() -> None:
    op.drop_table("sandboxes")
    op.drop_table("hosts")
