"""Wire schemas of the contract (§5), named after the wire fields exactly.

``DeployRequest`` validates the whole deploy body, base64 included: file contents and the zip archive
are decoded here, strictly (RFC 4648 §4, padding required, no whitespace).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

UNIQUE_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$")
DISPLAY_NAME_RE = re.compile(r"^[A-Za-z0-9 _|,&\-'\"/\\]+$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
B64_RE = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
MAX_FILES = 5000
MAX_ENV_KEYS = 200


def check_relative_path(value: str) -> str:
    """The §5.3.2 path rules: relative POSIX, no ``\\``, no empty / ``.`` / ``..`` segments, no controls."""
    if not 1 <= len(value) <= 1024:
        raise ValueError("must be 1-1024 characters")
    if value.startswith("/"):
        raise ValueError("must be a relative path")
    if "\\" in value:
        raise ValueError("must use / separators")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain control characters")
    if any(segment in ("", ".", "..") for segment in value.split("/")):
        raise ValueError("must not contain empty, '.' or '..' segments")
    return value


def strict_base64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    if len(value) % 4 or not B64_RE.match(value):
        raise ValueError("must be standard base64 with padding")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("must be standard base64 with padding") from exc


Base64Bytes = Annotated[bytes, BeforeValidator(strict_base64)]


def check_env_map(value: dict[str, str] | None) -> dict[str, str] | None:
    if value is None:
        return None
    if len(value) > MAX_ENV_KEYS:
        raise ValueError(f"at most {MAX_ENV_KEYS} keys")
    for key in value:
        if not ENV_KEY_RE.match(key):
            raise ValueError(f"invalid key {key!r}: must match ^[A-Za-z_][A-Za-z0-9_]*$")
    return value


class FileItem(BaseModel):
    path: StrictStr
    content: Base64Bytes

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_relative_path(value)


class FilesUpload(BaseModel):
    type: Literal["files"]
    files: list[FileItem] = Field(min_length=1, max_length=MAX_FILES)

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, files: list[FileItem]) -> list[FileItem]:
        seen: set[str] = set()
        for item in files:
            if item.path in seen:
                raise ValueError(f"duplicate path {item.path!r}")
            seen.add(item.path)
        return files


class ZipUpload(BaseModel):
    type: Literal["zip"]
    data: Base64Bytes
    filename: StrictStr = Field(min_length=1, max_length=255)

    @field_validator("data")
    @classmethod
    def _zip_magic(cls, value: bytes) -> bytes:
        if not value:
            raise ValueError("must not be empty")
        if not value.startswith((b"PK\x03\x04", b"PK\x05\x06")):
            raise ValueError("is not a ZIP archive")
        return value

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        if "/" in value or "\\" in value or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            raise ValueError("must not contain '/', '\\' or control characters")
        return value


OptionalText = Annotated[StrictStr | None, Field(default=None, max_length=255)]


class DeploySettings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    port: StrictInt = Field(default=3000, ge=1, le=65535)
    runtime: StrictStr = Field(default="build-ai", min_length=1, max_length=64)
    useBuildAI: StrictBool = True
    hasDockerfile: StrictBool = False
    framework: StrictStr | None = Field(default=None, max_length=64)
    installCommand: OptionalText
    buildCommand: OptionalText
    runCommand: OptionalText
    buildDir: OptionalText
    buildFlag: OptionalText
    runFlag: OptionalText
    directoryPath: StrictStr | None = None
    runEnvs: dict[StrictStr, StrictStr] | None = None
    buildVars: dict[StrictStr, StrictStr] | None = None

    @field_validator("directoryPath")
    @classmethod
    def _directory(cls, value: str | None) -> str | None:
        return None if value is None else check_relative_path(value)

    @field_validator("runEnvs", "buildVars")
    @classmethod
    def _env(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_env_map(value)


class DeployRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uniqueName: StrictStr
    displayName: StrictStr
    description: StrictStr | None = None
    months: StrictInt = Field(default=1, ge=1, le=120)
    upload: Annotated[FilesUpload | ZipUpload, Field(discriminator="type")]
    settings: DeploySettings | None = None

    @field_validator("uniqueName")
    @classmethod
    def _unique_name(cls, value: str) -> str:
        if not 4 <= len(value) <= 32:
            raise ValueError("must be 4-32 characters")
        if not UNIQUE_NAME_RE.match(value):
            raise ValueError("must be letters, digits and '-', not starting or ending with '-'")
        return value

    @field_validator("displayName")
    @classmethod
    def _display_name(cls, value: str) -> str:
        if not 4 <= len(value) <= 100:
            raise ValueError("must be 4-100 characters")
        if not DISPLAY_NAME_RE.match(value):
            raise ValueError("may contain letters, digits, space and _ | , & - ' \" / \\ only")
        return value

    @field_validator("description")
    @classmethod
    def _description(cls, value: str | None) -> str | None:
        if value is not None and not 4 <= len(value) <= 2048:
            raise ValueError("must be 4-2048 characters")
        return value


def error_field(loc: tuple[Any, ...]) -> str:
    """``("upload", "files", "files", 3, "path")`` → ``upload.files[3].path`` (drops the union tag)."""
    parts = list(loc)
    if len(parts) >= 2 and parts[0] == "upload" and parts[1] in ("files", "zip"):
        del parts[1]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


# ---- responses ---------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class DeployAccepted(BaseModel):
    projectId: str
    deploymentId: str
    status: Literal["deploying"] = "deploying"
    message: str


class UptoEntry(BaseModel):
    """One x402 ``upto`` authorisation of the project: what was authorised, what was settled and when."""

    network: str
    token: str
    state: str  # open | settling | submitted | confirming | settled | failed
    authorized_raw: str
    settled_raw: str | None = None
    consumed_seconds: int | None = None
    started_at: str
    due_at: str
    settled_at: str | None = None
    reason: str | None = None  # period_end | deleted | exhausted | deadline
    error: str | None = None  # x402's reason, when it failed
    tx_hash: str | None = None


class DeploymentStatusBody(BaseModel):
    status: Literal["deploying", "ready", "failed"]
    deployment_id: str
    deployment_status: str | None = None
    message: str | None = None
    endpoint: str | None = None
    reason: str | None = None
    #: The project's ``upto`` authorisations, oldest first (absent when it has none).
    upto: list[UptoEntry] | None = None


class ProjectItem(BaseModel):
    id: str
    name: str
    displayName: str
    status: str
    url: str | None
    createdAt: str


class ProjectList(BaseModel):
    wallet: str
    count: int
    projects: list[ProjectItem]


class ExtendRequest(BaseModel):
    """``POST /agent/projects/{projectId}/extend``: pay for ``months`` more of runtime."""

    model_config = ConfigDict(extra="ignore")

    months: StrictInt = Field(default=1, ge=1, le=120)


class ExtendAccepted(BaseModel):
    projectId: str
    months: int
    amount_usd: float
    current_credit_balance_usd: float
    message: str


class ProjectDeleted(BaseModel):
    projectId: str
    status: Literal["deleted"] = "deleted"


class TokenBalance(BaseModel):
    token: str
    symbol: str
    address: str
    balance: str
    balance_raw: str
    decimals: int


class BalanceBody(BaseModel):
    address: str
    chain: str
    chain_id: int
    balances: list[TokenBalance]


class ChainItem(BaseModel):
    chain: str
    chain_id: int
    tokens: list[str]


class ChainsBody(BaseModel):
    chains: list[ChainItem]


class RecipientItem(BaseModel):
    chain: str
    address: str


class RecipientsBody(BaseModel):
    updated_at: str
    recipients: list[RecipientItem]


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    error: str
    code: str
