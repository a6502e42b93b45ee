"""E2B's ``name:tag`` snapshot names (edge/e2b/snapshots.py): ``e2b_snapshot_tags``, which snapshot each
of a user's ``name:tag`` pairs names (``default`` for a name given without a tag).

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "e2b_snapshot_tags",
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Column("snapshot_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_e2b_snapshot_tags_snapshot_id", "e2b_snapshot_tags", ["snapshot_id"])


def downgrade() -> None:
    op.drop_index("ix_e2b_snapshot_tags_snapshot_id", table_name="e2b_snapshot_tags")
    op.drop_table("e2b_snapshot_tags")
