"""How many CPUs a create may ask of an E2B template (docs/e2b.md, `POST /v3/templates`): the
``maxCpuCount`` its build asked (SDK 2.64's ``max_cpu_count``), which makes the template resizable, kept
beside the build (``e2b_template_builds.max_cpu_count``). A build that asked none, and every build made
before it, has none: its sandboxes boot with its own CPUs only, as E2B's fixed-size templates do.

Revision ID: 0034
Revises: 0033
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.add_column(sa.Column("max_cpu_count", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("e2b_template_builds") as table:
        table.drop_column("max_cpu_count")
