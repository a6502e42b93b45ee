from __future__ import annotations

from paddock_controlplane.records.models import Base
from paddock_core.alembic_env import run

run(Base.metadata, version_table="alembic_version_controlplane")
