"""E2B's ``autoResume`` (docs/e2b.md, Auto-resume): a paused E2B sandbox with it set resumes when an SDK
call or traffic for one of its ports reaches it. Kept beside the E2B sandbox (``e2b_sandboxes``); every
sandbox made before it has it off, as E2B's default is.

Revision ID: 0031
Revises: 0030
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.add_column(sa.Column("auto_resume", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.drop_column("auto_resume")
