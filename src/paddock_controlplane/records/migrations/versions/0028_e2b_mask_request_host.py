"""E2B's ``network.maskRequestHost`` (docs/e2b.md): the ``Host`` the ingress sends to a sandbox's ports in
place of the one the client named, kept beside the E2B sandbox it was asked for (``e2b_sandboxes``);
``${PORT}`` in it is the port's number.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.add_column(sa.Column("mask_request_host", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.drop_column("mask_request_host")
