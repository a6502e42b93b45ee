"""Hibernation (issue #34, docs/hibernation.md): ``sandboxes.hibernated``, a paused sandbox whose host
keeps only its disk, and ``sandboxes.auto_hibernate_after_seconds``, how long a frozen pause may last
before the reconciler hibernates it (set by the pause that asked for it).

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("hibernated", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("auto_hibernate_after_seconds", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("auto_hibernate_after_seconds")
        batch.drop_column("hibernated")
