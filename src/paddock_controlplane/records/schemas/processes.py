"""Managed process bodies (§12.2)."""

from __future__ import annotations

import base64
import binascii

from pydantic import BaseModel, Field, StrictInt, StrictStr, field_validator

from paddock_hostagent.schemas import ProcessPty, ProcessSignal


class ProcessStartRequest(BaseModel):
    """``POST /processes``: without ``cmd`` a PTY runs a login shell (``bash -l``)."""

    cmd: str | None = Field(default=None, min_length=1, max_length=65536)
    args: list[str] | None = Field(default=None, max_length=65536)
    cwd: str | None = Field(default=None, min_length=1, max_length=4096)
    env: dict[str, str] | None = None
    pty: ProcessPty | None = None
    user: StrictStr | StrictInt | None = None  # as exec's (commands.check_user)


class ProcessInputRequest(BaseModel):
    data_base64: str = Field(max_length=(1 << 20) * 4 // 3 + 4)

    @field_validator("data_base64")
    @classmethod
    def strict_base64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be strict base64") from None
        return value


class ProcessResizeRequest(BaseModel):
    rows: int | None = Field(default=None, ge=1, le=10000)
    cols: int | None = Field(default=None, ge=1, le=10000)


class ProcessSignalRequest(BaseModel):
    signal: ProcessSignal
