"""A snapshot's copies of its sandbox's volumes (issue #34, ``include_volumes``): ``snapshot_volumes``, one
row per volume copy a snapshot keeps on its host, with the path and mode it was held at
(``records/snapshots.py``).

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshot_volumes",
        sa.Column("snapshot_id", sa.String(40), sa.ForeignKey("snapshots.id"), primary_key=True),
        sa.Column("volume_id", sa.String(40), primary_key=True),
        sa.Column("source_volume_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("mount_path", sa.String(4096), nullable=False),
        sa.Column("read_only", sa.Boolean, nullable=False),
        sa.Column("size_mib", sa.Integer, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("snapshot_volumes")
