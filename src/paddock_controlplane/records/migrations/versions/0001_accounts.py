"""Accounts: plans (seeded from the seed's plan table), users, API keys, the credit ledger.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

PLANS = [
    # id, name, conc, per day, net c/d, disk c/d, tpl c/d, max disk, vcpu, mem, webhooks
    ("free", "Free", 1, 10, 1, 10, 0, 0, 0, 0, 10240, 1, 1024, 2),
    ("beginner", "Beginner", 5, 50, 5, 50, 5, 50, 5, 50, 30720, 4, 4096, 4),
    ("pro", "Pro", 20, 200, 20, 200, 20, 200, 20, 200, 51200, 8, 8192, 6),
    ("enterprise", "Enterprise", 30, 300, 30, 300, 30, 300, 30, 300, 61440, 8, 16384, None),
]
PLAN_COLUMNS = [
    "id",
    "name",
    "concurrent_sandboxes",
    "sandboxes_per_day",
    "networks_concurrent",
    "networks_per_day",
    "disks_concurrent",
    "disks_per_day",
    "templates_concurrent",
    "templates_per_day",
    "max_disk_mib",
    "max_vcpu",
    "max_mem_mib",
    "webhook_endpoints",
]


def upgrade() -> None:
    plans = op.create_table(
        "plans",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        *[sa.Column(name, sa.Integer, nullable=False) for name in PLAN_COLUMNS[2:-1]],
        sa.Column("webhook_endpoints", sa.Integer, nullable=True),
    )
    op.bulk_insert(plans, [dict(zip(PLAN_COLUMNS, row, strict=True)) for row in PLANS])
    op.create_table(
        "users",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=True),
        sa.Column("plan_id", sa.String(32), sa.ForeignKey("plans.id"), nullable=False),
        sa.Column("credits_micro", sa.BigInteger, nullable=False),
        sa.Column("lock_version", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False, index=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
    )
    op.create_table(
        "credit_entries",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False, index=True),
        sa.Column("amount_micro", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("ref", sa.String(80), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in ("credit_entries", "api_keys", "users", "plans"):
        op.drop_table(table)
