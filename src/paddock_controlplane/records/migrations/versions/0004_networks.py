"""Private networks and their members.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "networks",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("cidr", sa.String(43), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
    )
    op.create_index("ix_networks_user_created", "networks", ["user_id", "created_at", "id"])
    op.create_index(
        "uq_networks_live_cidr",
        "networks",
        ["user_id", "cidr"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.create_table(
        "network_members",
        sa.Column("network_id", sa.String(40), sa.ForeignKey("networks.id"), primary_key=True),
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("ip", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("uq_network_members_ip", "network_members", ["network_id", "ip"], unique=True)
    op.create_index("ix_network_members_sandbox", "network_members", ["sandbox_id"])


def downgrade() -> None:
    op.drop_table("network_members")
    op.drop_table("networks")
