"""A timeout and an idle pause that hibernate (issues #33, #34; docs/hibernation.md): ``sandboxes.on_timeout``
widened from 8 to 16 characters for ``hibernate``, and ``sandboxes.on_idle``, what the idle auto-pause
does (``pause`` or ``hibernate``; absent: ``pause``).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.alter_column(
            "on_timeout", existing_type=sa.String(8), type_=sa.String(16), existing_nullable=True
        )
        batch.add_column(sa.Column("on_idle", sa.String(16), nullable=True))


def downgrade() -> None:
    # A lifetime that hibernates has no narrower spelling: it becomes the frozen pause it falls back to.
    op.execute(sa.text("UPDATE sandboxes SET on_timeout = 'pause' WHERE on_timeout = 'hibernate'"))
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("on_idle")
        batch.alter_column(
            "on_timeout", existing_type=sa.String(16), type_=sa.String(8), existing_nullable=True
        )
