"""E2B's ``network.httpsPorts`` (docs/e2b.md): the ports of a sandbox whose app serves HTTPS itself, which
the ingress reaches over TLS (not verified: self-signed certificates work), kept beside the E2B sandbox
(``e2b_sandboxes``) as a JSON list.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.add_column(sa.Column("https_ports", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.drop_column("https_ports")
