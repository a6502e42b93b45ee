"""A sandbox's lifetime and labels on ``/v1`` (issue #32): ``timeout_s``, ``on_timeout``, ``end_at``
(the reconciler's expiry pass destroys, or pauses, a sandbox whose ``end_at`` has passed, so the
lifetime holds across control-plane restarts) and ``metadata``, a bounded string map that list filters
on (``GET /v1/sandboxes?metadata.k=v``).

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("timeout_s", sa.Integer, nullable=True))
        batch.add_column(sa.Column("on_timeout", sa.String(8), nullable=True))
        batch.add_column(sa.Column("end_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("metadata", sa.JSON, nullable=True))
    op.create_index("ix_sandboxes_end_at", "sandboxes", ["end_at"])


def downgrade() -> None:
    op.drop_index("ix_sandboxes_end_at", "sandboxes")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("metadata")
        batch.drop_column("end_at")
        batch.drop_column("on_timeout")
        batch.drop_column("timeout_s")
