"""E2B's template start and ready commands (docs/e2b.md, Start and ready commands): what a build's
``startCmd`` and ``readyCmd`` ask, kept beside the build (``e2b_template_builds.start``, a JSON object),
for every E2B sandbox of its template to run at its create. Every build made before it has none.

Revision ID: 0032
Revises: 0031
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.add_column(sa.Column("start", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.drop_column("start")
