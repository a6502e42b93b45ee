"""SSH keys added through a sandbox's access token belong to that token (spec §12.1 extension).

They are kept on the token's row, not in ``sandboxes.ssh_pubkeys``, so the SSH gateway accepts them only
while that token is enabled: disabling, rotating or expiring it (or destroying the sandbox) stops them.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandbox_access_tokens") as batch:
        batch.add_column(sa.Column("ssh_pubkeys", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sandbox_access_tokens") as batch:
        batch.drop_column("ssh_pubkeys")
