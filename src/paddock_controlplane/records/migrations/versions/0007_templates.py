"""Templates (a Dockerfile and its image) and their build logs.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "templates",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("base", sa.String(128), nullable=False),
        sa.Column("from_image", sa.String(128), nullable=False),
        sa.Column("dockerfile", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.String(64), nullable=True),
        sa.Column("ext4_size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("lease_until", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("built_at", TS, nullable=True),
        sa.Column("deleted_at", TS, nullable=True),
    )
    op.create_index("ix_templates_user_created", "templates", ["user_id", "created_at", "id"])
    op.create_index(
        "uq_templates_live_name",
        "templates",
        ["user_id", "name"],
        unique=True,
        sqlite_where=sa.text("deleted_at IS NULL"),
        postgresql_where=sa.text("deleted_at IS NULL"),
    )
    op.create_index("ix_templates_status", "templates", ["status"])
    op.create_table(
        "template_log_lines",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "template_id", sa.String(40), sa.ForeignKey("templates.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("ts", TS, nullable=False),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
    )
    op.create_index("ix_template_log_lines_template", "template_log_lines", ["template_id", "id"])


def downgrade() -> None:
    op.drop_table("template_log_lines")
    op.drop_table("templates")
