"""The shape an E2B template's sandboxes boot with (docs/e2b.md, Template sizes): the smallest of
Paddock's shapes that holds the ``cpuCount`` and ``memoryMB`` its build asked, kept beside the build
(``e2b_template_builds.shape``). A build that asked neither, and every build made before it, has none:
its sandboxes boot with the E2B API's shape.

Revision ID: 0033
Revises: 0032
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.add_column(sa.Column("shape", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.drop_column("shape")
