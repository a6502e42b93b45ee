"""E2B sandboxes keep their lifetime and metadata in the native columns (issue #33): 0012's E2B-only
``end_at``/``timeout_s``/``auto_pause`` and ``e2b_sandbox_metadata`` are copied into ``sandboxes``'
``end_at``/``timeout_s``/``on_timeout``/``metadata`` (0013) where those are unset, then dropped, so
``/v1`` and the E2B API read and the reconciler's expiry pass enforces one lifetime and one label set.
``e2b_sandboxes`` keeps the ``templateID``, which has no native home.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    bind = op.get_bind()
    meta = sa.MetaData()
    sandboxes = sa.Table(
        "sandboxes",
        meta,
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("timeout_s", sa.Integer),
        sa.Column("on_timeout", sa.String(8)),
        sa.Column("end_at", TS),
        sa.Column("metadata", sa.JSON),
    )
    e2b = sa.Table(
        "e2b_sandboxes",
        meta,
        sa.Column("sandbox_id", sa.String(40)),
        sa.Column("timeout_s", sa.Integer),
        sa.Column("auto_pause", sa.Boolean),
        sa.Column("end_at", TS),
    )
    tags = sa.Table(
        "e2b_sandbox_metadata",
        meta,
        sa.Column("sandbox_id", sa.String(40)),
        sa.Column("key", sa.String(256)),
        sa.Column("value", sa.Text),
    )
    labels: dict[str, dict[str, str]] = {}
    for sandbox_id, key, value in bind.execute(sa.select(tags.c.sandbox_id, tags.c.key, tags.c.value)):
        labels.setdefault(sandbox_id, {})[key] = value
    lifetimes = {
        row.sandbox_id: row
        for row in bind.execute(sa.select(e2b.c.sandbox_id, e2b.c.timeout_s, e2b.c.auto_pause, e2b.c.end_at))
    }
    for sandbox_id in set(labels) | set(lifetimes):
        current = bind.execute(
            sa.select(sandboxes.c.timeout_s, sandboxes.c.metadata).where(sandboxes.c.id == sandbox_id)
        ).first()
        if current is None:
            continue
        values: dict[str, object] = {}
        if sandbox_id in labels and not current.metadata:
            values["metadata"] = labels[sandbox_id]
        row = lifetimes.get(sandbox_id)
        if row is not None and current.timeout_s is None and row.timeout_s:
            values["timeout_s"] = row.timeout_s
            values["on_timeout"] = "pause" if row.auto_pause else "destroy"
            values["end_at"] = row.end_at
        if values:
            bind.execute(sandboxes.update().where(sandboxes.c.id == sandbox_id).values(**values))
    op.drop_index("ix_e2b_sandbox_metadata_key_value", "e2b_sandbox_metadata")
    op.drop_table("e2b_sandbox_metadata")
    op.drop_index("ix_e2b_sandboxes_end_at", "e2b_sandboxes")
    with op.batch_alter_table("e2b_sandboxes") as batch:
        batch.drop_column("end_at")
        batch.drop_column("auto_pause")
        batch.drop_column("timeout_s")


def downgrade() -> None:
    with op.batch_alter_table("e2b_sandboxes") as batch:
        batch.add_column(sa.Column("timeout_s", sa.Integer, nullable=False, server_default="300"))
        batch.add_column(sa.Column("auto_pause", sa.Boolean, nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("end_at", TS, nullable=True))
    op.create_index("ix_e2b_sandboxes_end_at", "e2b_sandboxes", ["end_at"])
    op.create_table(
        "e2b_sandbox_metadata",
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("key", sa.String(256), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_index("ix_e2b_sandbox_metadata_key_value", "e2b_sandbox_metadata", ["key", "value"])
