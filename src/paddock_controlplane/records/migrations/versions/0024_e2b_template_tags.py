"""E2B's template tags (edge/e2b/templates.py): ``e2b_template_tags``, which build each of a user's
``name:tag`` pairs names (``default`` for a build given no tags); the build's Paddock template is in
``e2b_template_builds``.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "e2b_template_tags",
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Column("build_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_e2b_template_tags_build_id", "e2b_template_tags", ["build_id"])


def downgrade() -> None:
    op.drop_index("ix_e2b_template_tags_build_id", table_name="e2b_template_tags")
    op.drop_table("e2b_template_tags")
