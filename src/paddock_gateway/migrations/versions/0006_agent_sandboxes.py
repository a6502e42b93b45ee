"""Gateway: sandboxes rented by a wallet through x402 (``POST /agent/sandboxes``) and their running
intervals (paused time is in none of them).

Revision ID: gw0006
Revises: gw0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0006"
down_revision = "gw0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_agent_sandboxes",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("wallet", sa.String(42), nullable=False, index=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("shape", sa.String(64), nullable=False),
        sa.Column("rootfs", sa.String(128), nullable=False),
        sa.Column("scheme", sa.String(8), nullable=False),
        sa.Column("rate_raw", sa.BigInteger, nullable=False),
        sa.Column("block_s", sa.BigInteger, nullable=False),
        sa.Column("amount_raw", sa.BigInteger, nullable=False),
        sa.Column("tx_hash", sa.String(66), nullable=True),
        sa.Column("upto_id", sa.String(36), nullable=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("run_s", sa.BigInteger, nullable=False),
        sa.Column("running_since", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
    )
    op.create_table(
        "gw_agent_sandbox_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("sandbox_id", sa.String(64), nullable=False, index=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("gw_agent_sandbox_runs")
    op.drop_table("gw_agent_sandboxes")
