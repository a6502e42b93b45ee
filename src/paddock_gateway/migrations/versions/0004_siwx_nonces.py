"""Gateway: sign-in-with-x nonces, each accepted once.

Revision ID: gw0004
Revises: gw0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0004"
down_revision = "gw0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_siwx_nonces",
        sa.Column("nonce", sa.String(128), primary_key=True),
        sa.Column("wallet", sa.String(42), nullable=False),
        sa.Column("created_at", TS, nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("gw_siwx_nonces")
