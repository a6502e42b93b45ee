from __future__ import annotations

from paddock_core.alembic_env import run
from paddock_gateway.models import Base

run(Base.metadata, version_table="alembic_version_gateway")
