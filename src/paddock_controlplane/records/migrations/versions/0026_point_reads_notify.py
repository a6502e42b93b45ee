"""PostgreSQL only: every committed change to ``sandboxes`` or ``network_members`` (what
``GET /v1/sandboxes/{id}`` reads) is announced on the channel ``paddock_point_reads``, so each control
plane's ``db.PointReads`` can keep its results between changes, as it does on a SQLite file with
``PRAGMA data_version`` (issue #36). One statement-level notification per statement, no payload:
PostgreSQL folds the identical ones of a transaction into one, delivered at commit and never for a
rolled-back change. ``PointReads`` keeps results only where the function below exists.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

TABLES = ("sandboxes", "network_members")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION paddock_point_reads_notify() RETURNS trigger AS $$
        BEGIN
            PERFORM pg_notify('paddock_point_reads', '');
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    for table in TABLES:
        op.execute(
            f"""
            CREATE TRIGGER {table}_point_reads_notify AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
            ON {table} FOR EACH STATEMENT EXECUTE FUNCTION paddock_point_reads_notify()
            """
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_point_reads_notify ON {table}")
    op.execute("DROP FUNCTION IF EXISTS paddock_point_reads_notify()")
