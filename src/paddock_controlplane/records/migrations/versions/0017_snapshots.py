"""Snapshots (issue #34): ``snapshots``, one row per copy of a sandbox's disk kept on the host that made
it (``records/snapshots.py``).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("host_id", sa.String(64), nullable=False),
        sa.Column("source_sandbox_id", sa.String(40), nullable=False),
        sa.Column("image", sa.String(128), nullable=False),
        sa.Column("disk_mib", sa.Integer, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_snapshots_user_created", "snapshots", ["user_id", "created_at", "id"])
    op.create_index("uq_snapshots_user_name", "snapshots", ["user_id", "name"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_snapshots_user_name", "snapshots")
    op.drop_index("ix_snapshots_user_created", "snapshots")
    op.drop_table("snapshots")
