"""Gateway: x402 authorizations taken on for settlement (one row per payer nonce and token).

Revision ID: gw0002
Revises: gw0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0002"
down_revision = "gw0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_x402_authorizations",
        sa.Column("network", sa.String(32), primary_key=True),
        sa.Column("asset", sa.String(42), primary_key=True),
        sa.Column("payer", sa.String(42), primary_key=True),
        sa.Column("nonce", sa.String(66), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("tx_hash", sa.String(66), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gw_x402_authorizations")
