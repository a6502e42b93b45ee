"""Delegated sandbox access tokens (spec §12.1): one secret per sandbox that acts on that sandbox only.

An owner hands a token to an agent that should run commands in one sandbox without holding the
account's key. Like API keys, a token is ``sbt_`` + 32 random bytes (43 base64url characters), shown
once by create and rotate and stored only as its SHA-256: high entropy needs no slow hash, and the
lookup stays one indexed read.

A token is valid while its row is not revoked, not past ``expires_at``, and its sandbox is not
``destroyed`` or ``failed`` — so destroying a sandbox revokes its token without the destroy path having to know
about tokens. SSH keys added through a token belong to it (``ssh_pubkeys`` on its row, not the
sandbox's): the SSH gateway accepts them only while the token that added them is enabled, so they stop
with it. Principals are cached for 1 s (``hotcache.TTLCache``): a disable or rotate evicts the
old token from this process's cache at once; other control-plane processes stop honouring it within
that second. What a token may do is decided by ``Principal.require_scope`` (``records/principals.py``).

The table is declared here rather than in ``models.py`` because only this module reads or writes it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from paddock_controlplane.records.models import Base, Sandbox, User
from paddock_controlplane.records.principals import Principal
from paddock_controlplane.records.queries import get_owned
from paddock_controlplane.records.services import Services
from paddock_controlplane.records.states import CLOSED, TERMINAL
from paddock_core import errors
from paddock_core.crypto import random_token, sha256_hex
from paddock_core.db import transaction
from paddock_core.ids import new_id
from paddock_core.timeutil import as_utc, rfc3339

TOKEN_PREFIX = "sbt_"
TOKEN_BYTES = 32  # 43 base64url characters (§12.1)
#: Bounds of ``expires_in_seconds`` (an extension: §12.1 defines no expiry, so a token without it
#: lives until it is disabled, rotated or its sandbox is destroyed). At most a year.
MAX_TTL_S = 365 * 24 * 3600


class SandboxAccessToken(Base):
    __tablename__ = "sandbox_access_tokens"

    #: A sandbox has at most one token (§12.1): its id is the key; a new token replaces the row.
    sandbox_id: Mapped[str] = mapped_column(ForeignKey("sandboxes.id"), primary_key=True)
    #: Names this token generation in logs and principals (never the secret itself).
    id: Mapped[str] = mapped_column(String(40), unique=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    #: The last 4 characters, for ``token_hint`` — all a GET may show.
    last4: Mapped[str] = mapped_column(String(4))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    rotated_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: The lifetime asked for at create, kept so a rotate without a body keeps it.
    ttl_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: SSH keys added through this token generation (``POST …/ssh-pubkeys`` with the token): accepted by
    #: the SSH gateway only while the token is enabled; a new generation (create, rotate) starts with none.
    ssh_pubkeys: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


@dataclass(frozen=True)
class Issued:
    """A token just made: the only moment its plaintext exists outside the caller's hands."""

    row: SandboxAccessToken
    plaintext: str


def _enabled(row: SandboxAccessToken | None, now: dt.datetime) -> bool:
    return (
        row is not None
        and row.revoked_at is None
        and (row.expires_at is None or as_utc(row.expires_at) > now)
    )


def view(row: SandboxAccessToken | None, now: dt.datetime, plaintext: str | None = None) -> dict[str, Any]:
    """The wire shape of §12.1; ``token`` only when just issued, ``token_hint`` otherwise."""
    if row is None:
        return {"enabled": False}
    out: dict[str, Any] = {"enabled": _enabled(row, now)}
    if plaintext is not None:
        out["token"] = plaintext
    else:
        out["token_hint"] = f"{TOKEN_PREFIX}…{row.last4}"
    out["created_at"] = rfc3339(as_utc(row.created_at))
    if row.rotated_at is not None:
        out["rotated_at"] = rfc3339(as_utc(row.rotated_at))
    if row.expires_at is not None:
        out["expires_at"] = rfc3339(as_utc(row.expires_at))
    if row.ssh_pubkeys:
        out["ssh_pubkeys"] = list(row.ssh_pubkeys)
    return out


def check_ttl(ttl_s: int | None) -> None:
    if ttl_s is not None and not 1 <= ttl_s <= MAX_TTL_S:
        raise errors.ValidationFailed.field("expires_in_seconds", f"must be between 1 and {MAX_TTL_S}")


async def _owned_open(session: AsyncSession, user_id: str, sandbox_id: str) -> Sandbox:
    sandbox = await get_owned(session, user_id, sandbox_id, for_update=True)
    if sandbox.status in CLOSED:
        raise errors.InvalidState(f"sandbox is {sandbox.status}")
    return sandbox


def _new_secret(row: SandboxAccessToken, now: dt.datetime, ttl_s: int | None) -> str:
    plaintext = random_token(TOKEN_PREFIX, TOKEN_BYTES)
    row.id = new_id("sat_")
    row.token_hash = sha256_hex(plaintext)
    row.last4 = plaintext[-4:]
    row.revoked_at = None
    row.ttl_s = ttl_s
    row.expires_at = None if ttl_s is None else now + dt.timedelta(seconds=ttl_s)
    row.ssh_pubkeys = None
    return plaintext


def _forget(services: Services, row: SandboxAccessToken) -> None:
    """This process stops honouring the old token at once; other processes within the 1 s cache."""
    services.principals.drop(row.token_hash)


async def create(services: Services, user_id: str, sandbox_id: str, ttl_s: int | None) -> Issued:
    check_ttl(ttl_s)
    now = services.clock()
    async with transaction(services.sessions) as session:
        await _owned_open(session, user_id, sandbox_id)
        row = await session.get(SandboxAccessToken, sandbox_id)
        if _enabled(row, now):
            raise errors.AlreadyExists("this sandbox already has an enabled access token; rotate it")
        if row is None:
            row = SandboxAccessToken(sandbox_id=sandbox_id, user_id=user_id)
            session.add(row)
        else:
            _forget(services, row)
        row.created_at = now
        row.rotated_at = None
        plaintext = _new_secret(row, now, ttl_s)
    return Issued(row=row, plaintext=plaintext)


async def rotate(services: Services, user_id: str, sandbox_id: str, ttl_s: int | None) -> Issued:
    check_ttl(ttl_s)
    now = services.clock()
    async with transaction(services.sessions) as session:
        await _owned_open(session, user_id, sandbox_id)
        row = await session.get(SandboxAccessToken, sandbox_id)
        if row is None or not _enabled(row, now):
            raise errors.InvalidState("this sandbox has no enabled access token to rotate")
        _forget(services, row)
        row.rotated_at = now
        plaintext = _new_secret(row, now, row.ttl_s if ttl_s is None else ttl_s)
    return Issued(row=row, plaintext=plaintext)


async def disable(services: Services, user_id: str, sandbox_id: str) -> SandboxAccessToken | None:
    """Idempotent: a sandbox without a token, or with one already disabled, answers the same."""
    async with transaction(services.sessions) as session:
        await get_owned(session, user_id, sandbox_id, for_update=True)
        row = await session.get(SandboxAccessToken, sandbox_id)
        if row is not None:
            if row.revoked_at is None:
                row.revoked_at = services.clock()
            _forget(services, row)
    return row


async def describe(services: Services, user_id: str, sandbox_id: str) -> dict[str, Any]:
    async with services.sessions() as session:
        sandbox = await get_owned(session, user_id, sandbox_id)
        row = await session.get(SandboxAccessToken, sandbox_id)
    described = view(row, services.clock())
    if sandbox.status in TERMINAL:
        described["enabled"] = False  # a sandbox gone for good takes its token with it (§12.1)
    return described


async def authenticate(session: AsyncSession, presented: str, now: dt.datetime) -> Principal:
    """The principal of a delegated token: the sandbox owner's account, bound to that one sandbox."""
    row = (
        await session.execute(
            select(
                SandboxAccessToken.id,
                SandboxAccessToken.sandbox_id,
                SandboxAccessToken.user_id,
                SandboxAccessToken.revoked_at,
                SandboxAccessToken.expires_at,
                Sandbox.status,
                User.plan_id,
            )
            .join(Sandbox, Sandbox.id == SandboxAccessToken.sandbox_id)
            .join(User, User.id == SandboxAccessToken.user_id)
            .where(SandboxAccessToken.token_hash == sha256_hex(presented))
        )
    ).first()
    expires_at = None if row is None or row.expires_at is None else as_utc(row.expires_at)
    if (
        row is None
        or row.revoked_at is not None
        or (expires_at is not None and expires_at <= now)
        or row.status in TERMINAL
    ):
        raise errors.Unauthorized("missing, invalid, expired or revoked API key or access token")
    return Principal(
        user_id=row.user_id,
        plan_id=row.plan_id,
        key_id=row.id,
        sandbox_id=row.sandbox_id,
        expires_at=expires_at,
    )


async def add_ssh_keys(
    session: AsyncSession, sandbox_id: str, token_id: str, keys: list[str], now: dt.datetime
) -> list[str]:
    """Keys added through the token generation ``token_id`` join that token's own list (returned). A
    token disabled, expired or rotated since the caller's principal was cached is refused (401), so a
    stale principal cannot add keys to the token that replaced it."""
    row = await session.get(SandboxAccessToken, sandbox_id, with_for_update=True)
    if row is None or row.id != token_id or not _enabled(row, now):
        raise errors.Unauthorized("missing, invalid, expired or revoked API key or access token")
    row.ssh_pubkeys = list(dict.fromkeys([*(row.ssh_pubkeys or []), *keys]))
    return list(row.ssh_pubkeys)


async def enabled_ssh_keys(
    session: AsyncSession, sandbox_ids: list[str], now: dt.datetime
) -> dict[str, list[str]]:
    """The keys added through each sandbox's token, for the sandboxes whose token is enabled now."""
    if not sandbox_ids:
        return {}
    rows = (
        await session.scalars(
            select(SandboxAccessToken).where(SandboxAccessToken.sandbox_id.in_(sandbox_ids))
        )
    ).all()
    return {
        row.sandbox_id: list(row.ssh_pubkeys or []) for row in rows if _enabled(row, now) and row.ssh_pubkeys
    }
