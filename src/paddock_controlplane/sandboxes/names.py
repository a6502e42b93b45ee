"""Generated sandbox names: ``<adjective>-<animal>``, with a numeric suffix when needed."""

from __future__ import annotations

import secrets

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.states import TERMINAL

ADJECTIVES = [
    "brave",
    "calm",
    "clever",
    "eager",
    "fancy",
    "gentle",
    "happy",
    "jolly",
    "keen",
    "lively",
    "merry",
    "nimble",
    "proud",
    "quick",
    "quiet",
    "rapid",
    "shiny",
    "silent",
    "steady",
    "swift",
    "tidy",
    "vivid",
    "witty",
    "zesty",
    "bold",
    "bright",
    "cosy",
    "daring",
    "fresh",
    "lucky",
]
ANIMALS = [
    "otter",
    "badger",
    "falcon",
    "heron",
    "lynx",
    "marten",
    "newt",
    "ocelot",
    "panda",
    "quail",
    "raven",
    "seal",
    "tapir",
    "viper",
    "walrus",
    "yak",
    "zebra",
    "beaver",
    "bison",
    "camel",
    "dingo",
    "egret",
    "ferret",
    "gecko",
    "ibis",
    "koala",
    "lemur",
    "moose",
    "puffin",
]


# Built once: every create asks it (building and keying a statement costs about what SQLite takes to
# run it).
_TAKEN = select(Sandbox.id).where(
    Sandbox.user_id == bindparam("user_id"),
    Sandbox.name == bindparam("name"),
    Sandbox.status.not_in(TERMINAL),
)


async def taken(session: AsyncSession, user_id: str, name: str) -> bool:
    found = await session.scalar(_TAKEN, {"user_id": user_id, "name": name})
    return found is not None


async def generate(session: AsyncSession, user_id: str) -> str:
    base = f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}"
    if not await taken(session, user_id, base):
        return base
    for _ in range(50):
        candidate = f"{base}-{secrets.randbelow(9000) + 1000}"
        if not await taken(session, user_id, candidate):
            return candidate
    return f"{base}-{secrets.token_hex(4)}"
