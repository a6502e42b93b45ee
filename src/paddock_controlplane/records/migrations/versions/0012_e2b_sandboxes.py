"""E2B compatibility (docs/e2b.md): what an E2B sandbox has that a Paddock sandbox does not.

``e2b_sandboxes`` holds, per sandbox created or touched through the E2B API, its ``templateID``, its
lifetime (``end_at``: E2B's ``timeout`` is seconds until the sandbox is killed, or paused with
``autoPause``; the E2B listener's expiry worker acts on it) and its metadata, one row per key in
``e2b_sandbox_metadata`` so that list filters are indexed reads on either database.
``e2b_template_builds`` names the builds ``POST /v3/templates`` hands out before their steps are known;
the Paddock template is made (``template_id``) when the build is started.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "e2b_sandboxes",
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("template_id", sa.String(128), nullable=False),
        sa.Column("timeout_s", sa.Integer, nullable=False),
        sa.Column("auto_pause", sa.Boolean, nullable=False),
        sa.Column("end_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_e2b_sandboxes_end_at", "e2b_sandboxes", ["end_at"])
    op.create_table(
        "e2b_sandbox_metadata",
        sa.Column("sandbox_id", sa.String(40), sa.ForeignKey("sandboxes.id"), primary_key=True),
        sa.Column("key", sa.String(256), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_index("ix_e2b_sandbox_metadata_key_value", "e2b_sandbox_metadata", ["key", "value"])
    op.create_table(
        "e2b_template_builds",
        sa.Column("build_id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(40), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("template_id", sa.String(40), nullable=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_e2b_template_builds_user_name", "e2b_template_builds", ["user_id", "name"])


def downgrade() -> None:
    op.drop_table("e2b_template_builds")
    op.drop_table("e2b_sandbox_metadata")
    op.drop_table("e2b_sandboxes")
