"""Generated sandbox names: ``<adjective>-<animal>``, with a numeric suffix when needed."""

from __future__ import annotations

import secrets
from collections.abc import Collection

from sqlalchemy import Select, bindparam, select
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


def _taken_query(name_param: str) -> Select[str]:
    return select(Sandbox.id).where(
        Sandbox.user_id == bindparam("user_id"),
        Sandbox.name == bindparam(name_param),
        Sandbox.status.not_in(TERMINAL),
    )


# Built once: every create asks it (building and keying a statement costs about what SQLite takes to
# run it).
_TAKEN = _taken_query("name")
#: Whether ``name`` is a live sandbox's of ``user_id``, as a column: a create reads it with its caps.
TAKEN = _TAKEN.exists()
#: The same for ``name_also``, the numbered name a create falls back to (:func:`draw`).
TAKEN_ALSO = _taken_query("name_also").exists()


#: Which of some names are live sandboxes' of ``user_id``: a group of creates checks all of its
#: members' names in one trip.
_TAKEN_AMONG = select(Sandbox.name).where(
    Sandbox.user_id == bindparam("user_id"),
    Sandbox.name.in_(bindparam("names", expanding=True)),
    Sandbox.status.not_in(TERMINAL),
)


async def taken(session: AsyncSession, user_id: str, name: str) -> bool:
    found = await session.scalar(_TAKEN, {"user_id": user_id, "name": name})
    return found is not None


async def taken_among(session: AsyncSession, user_id: str, names: Collection[str]) -> set[str]:
    if not names:
        return set()
    found = await session.scalars(_TAKEN_AMONG, {"user_id": user_id, "names": sorted(set(names))})
    return set(found.all())


def draw() -> tuple[str, str]:
    """Two names to check at once, unchecked: a plain one and the same numbered. There are only 870
    plain names, so an account with hundreds of live sandboxes finds most of them taken; checked in
    the same statement, the numbered one saves that account's create a second trip under its lock."""
    base = _base()
    return base, _numbered(base)


def _base() -> str:
    return f"{secrets.choice(ADJECTIVES)}-{secrets.choice(ANIMALS)}"


def _numbered(base: str) -> str:
    return f"{base}-{secrets.randbelow(9000) + 1000}"


async def generate(session: AsyncSession, user_id: str, avoid: Collection[str] = ()) -> str:
    """A name no live sandbox of ``user_id`` has, nor one in ``avoid`` (names given to rows not yet
    written, by the same group of creates)."""
    base = _base()
    if base not in avoid and not await taken(session, user_id, base):
        return base
    for _ in range(50):
        candidate = _numbered(base)
        if candidate not in avoid and not await taken(session, user_id, candidate):
            return candidate
    return f"{base}-{secrets.token_hex(4)}"
