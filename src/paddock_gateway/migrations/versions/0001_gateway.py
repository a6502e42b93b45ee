"""Gateway: nonces, payment ledger, credit ledger, projects, deployments, sandbox deployments.

Revision ID: gw0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "gw0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gw_nonces",
        sa.Column("wallet", sa.String(42), primary_key=True),
        sa.Column("nonce", sa.String(36), primary_key=True),
        sa.Column("created_at", TS, nullable=False, index=True),
    )
    op.create_table(
        "gw_payments",
        sa.Column("tx_hash", sa.String(66), primary_key=True),
        sa.Column("wallet", sa.String(42), nullable=False, index=True),
        sa.Column("chain", sa.String(16), nullable=False),
        sa.Column("token", sa.String(8), nullable=False),
        sa.Column("amount_raw", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("deployment_id", sa.String(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "gw_wallets",
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("balance_micro", sa.BigInteger, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "gw_credit_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("wallet", sa.String(42), nullable=False, index=True),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=False, unique=True),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "gw_projects",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("wallet", sa.String(42), nullable=False, index=True),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("name_key", sa.String(32), nullable=True, unique=True),
        sa.Column("display_name", sa.String(100), nullable=False),
        sa.Column("description", sa.Text, nullable=True),
        sa.Column("monthly_raw", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("latest_deployment_id", sa.String(64), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("metered_until", TS, nullable=False),
        sa.Column("hours_metered", sa.Integer, nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
    )
    op.create_table(
        "gw_deployments",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), sa.ForeignKey("gw_projects.id"), nullable=False, index=True),
        sa.Column("wallet", sa.String(42), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "gw_sandbox_deployments",
        sa.Column("deployment_id", sa.String(64), primary_key=True),
        sa.Column("project_id", sa.String(64), nullable=False, index=True),
        sa.Column("sandbox_id", sa.String(80), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("url", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("plan", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "gw_sandbox_deployments",
        "gw_deployments",
        "gw_projects",
        "gw_credit_entries",
        "gw_wallets",
        "gw_payments",
        "gw_nonces",
    ):
        op.drop_table(table)
