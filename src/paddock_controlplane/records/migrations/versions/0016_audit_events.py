"""The audit trail of agent actions (issue #35): ``audit_events``, one row per API call on a sandbox,
command run, file written or read, process started, egress attempt seen or ``dropped`` marker, with the
owner kept on each row so the trail outlives the sandbox's own row; and ``audit_egress_cursors``, how
far the host agents' egress attempts have been read, so no control plane records one twice.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column("sandbox_id", sa.String(40), nullable=False),
        sa.Column("user_id", sa.String(40), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(64), nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_audit_events_sandbox_at", "audit_events", ["sandbox_id", "at", "id"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_table(
        "audit_egress_cursors",
        sa.Column("host_id", sa.String(40), primary_key=True),
        sa.Column("epoch", sa.String(40), nullable=False),
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("audit_egress_cursors")
    op.drop_index("ix_audit_events_at", "audit_events")
    op.drop_index("ix_audit_events_sandbox_at", "audit_events")
    op.drop_table("audit_events")
