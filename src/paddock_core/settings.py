"""Settings base shared by the services: one pydantic-settings class per service, one env prefix each.

Settings objects are built in each service's ``main()`` and passed down; nothing here creates one at
import time.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATA_DIR = Path("/var/lib/paddock")
PLACEHOLDER_SECRETS = {"", "changeme", "change-me", "secret"}


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    host: str = "127.0.0.1"
    port: int = 0
    log_level: str = "info"
    log_json: bool | None = None

    @staticmethod
    def reject_placeholder(value: SecretStr, name: str) -> SecretStr:
        if value.get_secret_value().strip().lower() in PLACEHOLDER_SECRETS:
            raise ValueError(f"{name} is unset or a placeholder; set a real secret")
        return value


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


class DatabaseSettingsMixin(BaseSettings):
    database_url: str = ""

    @field_validator("database_url")
    @classmethod
    def _known_driver(cls, value: str) -> str:
        if value and not value.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://", "postgresql://")):
            raise ValueError("database_url must be sqlite+aiosqlite:// or postgresql+asyncpg://")
        if value.startswith("postgresql://"):
            value = "postgresql+asyncpg://" + value.removeprefix("postgresql://")
        return value
