"""Stored bytes are billed (issue #34, resources/billing.py ``storage_pass``): ``snapshots.billed_until``
and ``volumes.billed_until``, how far each has been charged (absent: from its ``created_at``).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("snapshots", "volumes"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("billed_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in ("volumes", "snapshots"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("billed_until")
