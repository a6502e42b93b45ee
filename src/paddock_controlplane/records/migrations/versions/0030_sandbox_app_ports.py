"""How a sandbox's ports are reached (records/app_ports.py, docs/ingress.md) moves from the E2B-only row
onto the sandbox's own (``ingress_host_header``, ``ingress_https_ports``), so that Paddock's /v1 sets and
shows it for every sandbox, and the ingress reads it with the rest of its route. What 0028 and 0029 kept in
``e2b_sandboxes`` is copied over, then dropped there.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

# Correlated subqueries: the one UPDATE spelling SQLite and PostgreSQL both take.
_COPY_UP = """
UPDATE sandboxes SET
  ingress_host_header = (SELECT e.mask_request_host FROM e2b_sandboxes e WHERE e.sandbox_id = sandboxes.id),
  ingress_https_ports = (SELECT e.https_ports FROM e2b_sandboxes e WHERE e.sandbox_id = sandboxes.id)
WHERE id IN (
  SELECT sandbox_id FROM e2b_sandboxes WHERE mask_request_host IS NOT NULL OR https_ports IS NOT NULL
)
"""
_COPY_DOWN = """
UPDATE e2b_sandboxes SET
  mask_request_host = (SELECT s.ingress_host_header FROM sandboxes s WHERE s.id = e2b_sandboxes.sandbox_id),
  https_ports = (SELECT s.ingress_https_ports FROM sandboxes s WHERE s.id = e2b_sandboxes.sandbox_id)
"""


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as table:
        table.add_column(sa.Column("ingress_host_header", sa.String(255), nullable=True))
        table.add_column(sa.Column("ingress_https_ports", sa.JSON, nullable=True))
    op.execute(_COPY_UP)
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.drop_column("https_ports")
        table.drop_column("mask_request_host")


def downgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as table:
        table.add_column(sa.Column("mask_request_host", sa.String(255), nullable=True))
        table.add_column(sa.Column("https_ports", sa.JSON, nullable=True))
    op.execute(_COPY_DOWN)
    with op.batch_alter_table("sandboxes") as table:
        table.drop_column("ingress_https_ports")
        table.drop_column("ingress_host_header")
