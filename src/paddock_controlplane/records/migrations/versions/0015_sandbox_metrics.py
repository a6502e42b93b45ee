"""Per-sandbox metrics (issue #35): ``sandbox_metric_samples`` holds what the metrics worker pulls from
each host agent's ``/internal/v1/stats`` — raw samples (``bucket_s`` 0) kept for an hour, and one-minute
rollups (``bucket_s`` 60: gauges averaged, counters and limits at their last value) kept for a day
(records/sandbox_metrics.py). No foreign key to ``sandboxes``: samples are deleted by age alone, and
a sandbox row must stay deletable without touching them.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sandbox_metric_samples",
        sa.Column("sandbox_id", sa.String(40), primary_key=True),
        sa.Column("bucket_s", sa.Integer, primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("user_id", sa.String(40), nullable=False),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("vcpu", sa.Integer, nullable=False),
        sa.Column("cpu_pct", sa.Float, nullable=False),
        sa.Column("mem_used_bytes", sa.BigInteger, nullable=False),
        sa.Column("mem_limit_bytes", sa.BigInteger, nullable=False),
        sa.Column("disk_used_bytes", sa.BigInteger, nullable=False),
        sa.Column("disk_limit_bytes", sa.BigInteger, nullable=False),
        sa.Column("net_rx_bytes", sa.BigInteger, nullable=False),
        sa.Column("net_tx_bytes", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_sandbox_metric_samples_user", "sandbox_metric_samples", ["user_id", "bucket_s", "at"])
    op.create_index("ix_sandbox_metric_samples_age", "sandbox_metric_samples", ["bucket_s", "at"])


def downgrade() -> None:
    op.drop_index("ix_sandbox_metric_samples_age", "sandbox_metric_samples")
    op.drop_index("ix_sandbox_metric_samples_user", "sandbox_metric_samples")
    op.drop_table("sandbox_metric_samples")
