"""Gateway: x402 payment identifiers, one answer per (wallet, id).

Revision ID: gw0003
Revises: gw0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0003"
down_revision = "gw0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_x402_payment_ids",
        sa.Column("wallet", sa.String(42), primary_key=True),
        sa.Column("payment_id", sa.String(128), primary_key=True),
        sa.Column("terms", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("nonce", sa.String(66), nullable=True),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("deployment_id", sa.String(64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("tx_hash", sa.String(66), nullable=True),
        sa.Column("payment_response", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("gw_x402_payment_ids")
