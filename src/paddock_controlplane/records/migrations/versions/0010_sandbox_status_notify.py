"""PostgreSQL only: a committed change of a sandbox's status is announced on the channel
``paddock_sandbox_status`` (payload: the sandbox id), so every control plane wakes its long polls at
once, not only the one that made the change (status_notify.py). NOTIFY is delivered at commit, never
for a rolled-back change. SQLite has one process and needs none of it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION paddock_sandbox_status_notify() RETURNS trigger AS $$
        BEGIN
            PERFORM pg_notify('paddock_sandbox_status', NEW.id);
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        """
        CREATE TRIGGER sandbox_status_notify AFTER UPDATE OF status ON sandboxes
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION paddock_sandbox_status_notify()
        """
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS sandbox_status_notify ON sandboxes")
    op.execute("DROP FUNCTION IF EXISTS paddock_sandbox_status_notify()")
