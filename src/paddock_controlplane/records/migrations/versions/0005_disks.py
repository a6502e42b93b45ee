"""S3 disks and their attachments to sandboxes.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "disks",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("credentials_sealed", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
    )
    op.create_index("ix_disks_user_created", "disks", ["user_id", "created_at", "id"])
    op.create_index(
        "uq_disks_live_name",
        "disks",
        ["user_id", "name"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.create_table(
        "sandbox_disks",
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("mount_path", sa.String(1024), primary_key=True),
        sa.Column("disk_id", sa.String(40), sa.ForeignKey("disks.id"), nullable=False),
        sa.Column("sub_path", sa.String(1024), nullable=True),
        sa.Column("mount_status", sa.String(16), nullable=False),
        sa.Column("mount_error", sa.String(500), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_sandbox_disks_disk", "sandbox_disks", ["disk_id"])


def downgrade() -> None:
    op.drop_table("sandbox_disks")
    op.drop_table("disks")
