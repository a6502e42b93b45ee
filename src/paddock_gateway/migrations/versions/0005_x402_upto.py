"""Gateway: x402 ``upto`` authorisations funding a project's runtime, authorised vs settled.

Revision ID: gw0005
Revises: gw0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0005"
down_revision = "gw0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_x402_upto",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("project_id", sa.String(64), nullable=False, index=True),
        sa.Column("wallet", sa.String(42), nullable=False),
        sa.Column("network", sa.String(32), nullable=False),
        sa.Column("chain", sa.String(16), nullable=False),
        sa.Column("token", sa.String(8), nullable=False),
        sa.Column("payer", sa.String(42), nullable=False),
        sa.Column("nonce", sa.String(66), nullable=False),
        sa.Column("permit", sa.JSON, nullable=False),
        sa.Column("authorized_raw", sa.BigInteger, nullable=False),
        sa.Column("price_raw", sa.BigInteger, nullable=False),
        sa.Column("period_s", sa.BigInteger, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("due_at", TS, nullable=False, index=True),
        sa.Column("stopped_at", TS, nullable=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("reason", sa.String(16), nullable=True),
        sa.Column("consumed_s", sa.BigInteger, nullable=True),
        sa.Column("settled_raw", sa.BigInteger, nullable=True),
        sa.Column("tx_hash", sa.String(66), nullable=True),
        sa.Column("error", sa.String(64), nullable=True),
        sa.Column("settled_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("network", "payer", "nonce"),
    )


def downgrade() -> None:
    op.drop_table("gw_x402_upto")
