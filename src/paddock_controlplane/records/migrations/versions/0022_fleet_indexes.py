"""A fleet's hot reads (issue #36, bench/fleet_sim.py), each a scan of every sandbox row before (100,000
in the simulation):

- ``ix_sandboxes_host_status`` on ``sandboxes (host_id, status)``: every heartbeat reads its host's
  reported sandboxes, every placement sums the memory held on its leading hosts, and the reconciler
  finds the sandboxes of dead hosts;
- ``ix_sandboxes_auto_pause`` and ``ix_sandboxes_auto_hibernate``, on ``status`` of only the rows that
  asked for an idle pause or a hibernation: the reconciler's passes over them run every second.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


PARTIAL = {
    "ix_sandboxes_auto_pause": "auto_pause_after_seconds IS NOT NULL",
    "ix_sandboxes_auto_hibernate": "auto_hibernate_after_seconds IS NOT NULL",
}


def upgrade() -> None:
    op.create_index("ix_sandboxes_host_status", "sandboxes", ["host_id", "status"])
    for name, where in PARTIAL.items():
        op.create_index(
            name, "sandboxes", ["status"], sqlite_where=sa.text(where), postgresql_where=sa.text(where)
        )


def downgrade() -> None:
    for name in PARTIAL:
        op.drop_index(name, table_name="sandboxes")
    op.drop_index("ix_sandboxes_host_status", table_name="sandboxes")
