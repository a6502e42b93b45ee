"""Local persistent volumes (issue #34): ``volumes``, one row per XFS volume kept on the host that made
it, and ``volume_attachments``, which sandboxes hold which volume (``records/volumes.py``).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "volumes",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("host_id", sa.String(64), nullable=False),
        sa.Column("size_mib", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_volumes_user_created", "volumes", ["user_id", "created_at", "id"])
    op.create_index("uq_volumes_user_name", "volumes", ["user_id", "name"], unique=True)
    op.create_table(
        "volume_attachments",
        sa.Column("sandbox_id", sa.String(40), primary_key=True),
        sa.Column("volume_id", sa.String(40), sa.ForeignKey("volumes.id"), primary_key=True),
        sa.Column("mount_path", sa.String(4096), nullable=False),
        sa.Column("read_only", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_volume_attachments_volume", "volume_attachments", ["volume_id"])


def downgrade() -> None:
    op.drop_index("ix_volume_attachments_volume", "volume_attachments")
    op.drop_table("volume_attachments")
    op.drop_index("uq_volumes_user_name", "volumes")
    op.drop_index("ix_volumes_user_created", "volumes")
    op.drop_table("volumes")
