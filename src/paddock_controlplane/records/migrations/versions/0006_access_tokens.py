"""Delegated sandbox access tokens (spec §12.1): at most one per sandbox, stored as a hash.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "sandbox_access_tokens",
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("id", sa.String(40), nullable=False, unique=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        # The SHA-256 of the token, never the token: authentication is one indexed read of it.
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("last4", sa.String(4), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("rotated_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("ttl_s", sa.Integer, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("sandbox_access_tokens")
