#!/usr/bin/env bash
# Start the Debian PostgreSQL cluster (installed by setup-host.sh) and make sure the test role exists.
# Idempotent. Prints the asyncpg URL the test suite uses.
set -euo pipefail
# Only the URL goes to stdout: pg_ctlcluster and psql chatter ("Removed stale pid file.") goes to stderr.
exec 3>&1 1>&2
ver=$(ls /etc/postgresql | sort -n | tail -1)
if ! pg_lsclusters -h | awk -v v="$ver" '$1==v && $2=="main" {print $4}' | grep -q online; then
  pg_ctlcluster "$ver" main start 3>&-
fi
for _ in $(seq 1 50); do
  su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
  sleep 0.2
done
su postgres -c "psql -qAtc \"select 1 from pg_roles where rolname='paddock'\"" | grep -q 1 ||
  su postgres -c "psql -qc \"create role paddock login superuser password 'paddock'\""
echo "postgresql+asyncpg://paddock:paddock@127.0.0.1:5432/postgres" >&3
