"""``paddock admin …``: users, plans, API keys and hosts, straight against the control plane's database."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from paddock_cli.listing import LAZY_GROUPS

app = typer.Typer(no_args_is_help=True, help=LAZY_GROUPS["admin"].help)
user_app = typer.Typer(no_args_is_help=True, help="Create users and change their plan.")
key_app = typer.Typer(no_args_is_help=True, help="Create, revoke and list API keys.")
app.add_typer(user_app, name="user")
host_app = typer.Typer(no_args_is_help=True, help="List hosts; drain one or put it back in service.")
app.add_typer(key_app, name="key")
app.add_typer(host_app, name="host")

T = TypeVar("T")

JSON_OUT = typer.Option(False, "--json", help="Print JSON")


def emit_json(value: Any) -> None:
    typer.echo(json.dumps(value))


def data_dir_override() -> Path | None:
    """``paddock serve`` keeps the control plane's state in ``PADDOCK_DATA_DIR`` (its children get it
    as ``PADDOCK_CP_DATA_DIR``); an admin command run with the same environment reads the same database.
    An explicit ``PADDOCK_CP_DATA_DIR`` (or ``PADDOCK_CP_DATABASE_URL``) still wins."""
    if os.environ.get("PADDOCK_CP_DATA_DIR") or not os.environ.get("PADDOCK_DATA_DIR"):
        return None
    return Path(os.environ["PADDOCK_DATA_DIR"])


def _run(work: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run ``work(session, settings)`` in one transaction on a migrated database.

    It migrates as the control plane's ``app.migrate`` does (``upgrade`` with the control plane's
    migrations) without importing ``paddock_controlplane.app``: that is the whole web app (FastAPI, every
    route), over a second of an admin command's start on a loaded box, for one path."""
    import asyncio

    import paddock_controlplane.records.migrations
    from paddock_controlplane.settings import ControlPlaneSettings
    from paddock_core.db import make_engine, make_sessionmaker, transaction, upgrade
    from paddock_core.errors import PaddockError

    data_dir = data_dir_override()
    settings = ControlPlaneSettings(data_dir=data_dir) if data_dir else ControlPlaneSettings()
    migrations = Path(paddock_controlplane.records.migrations.__file__).parent

    async def go() -> T:
        await upgrade(migrations, settings.database_url)
        engine = make_engine(settings.database_url)
        try:
            async with transaction(make_sessionmaker(engine)) as session:
                return await work(session, settings)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(go())
    except PaddockError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None


@user_app.command("create")
def user_create(
    plan: str = typer.Option("", help="free, beginner, pro or enterprise (default: the server's default)"),
    name: str = typer.Option("", help="A label for the user"),
    json_out: bool = JSON_OUT,
) -> None:
    """Create a user with the signup credits and print its first API key (shown once)."""
    from paddock_controlplane.resources import accounts

    async def work(session: Any, settings: Any) -> dict[str, str]:
        user = await accounts.create_user(
            session,
            plan_id=plan or settings.default_plan,
            signup_credits=settings.signup_credits,
            name=name or None,
        )
        key = await accounts.create_key(session, user.id)
        return {"user_id": user.id, "plan": user.plan_id, "key_id": key.id, "api_key": key.plaintext}

    out = _run(work)
    if json_out:
        emit_json(out)
    else:
        typer.echo(f"user {out['user_id']} (plan {out['plan']})")
        typer.echo(f"API key (shown once): {out['api_key']}")


@user_app.command("set-plan")
def user_set_plan(user_id: str, plan: str, json_out: bool = JSON_OUT) -> None:
    """Move a user to another plan."""
    from paddock_controlplane.resources import accounts

    async def work(session: Any, _: Any) -> str:
        return (await accounts.set_plan(session, user_id, plan)).plan_id

    now = _run(work)
    if json_out:
        emit_json({"user_id": user_id, "plan": now})
    else:
        typer.echo(f"user {user_id} is now on plan {now}")


@key_app.command("create")
def key_create(user_id: str, json_out: bool = JSON_OUT) -> None:
    """Issue another API key for a user (shown once)."""
    from paddock_controlplane.resources import accounts

    async def work(session: Any, _: Any) -> Any:
        return await accounts.create_key(session, user_id)

    issued = _run(work)
    if json_out:
        emit_json({"user_id": user_id, "key_id": issued.id, "api_key": issued.plaintext})
    else:
        typer.echo(f"key {issued.id}")
        typer.echo(f"API key (shown once): {issued.plaintext}")


@key_app.command("revoke")
def key_revoke(key_id: str, json_out: bool = JSON_OUT) -> None:
    """Revoke a key; requests with it get 401 from then on."""
    from paddock_controlplane.resources import accounts

    async def work(session: Any, _: Any) -> Any:
        return await accounts.revoke_key(session, key_id)

    _run(work)
    if json_out:
        emit_json({"key_id": key_id, "revoked": True})
    else:
        typer.echo(f"key {key_id} revoked")


@key_app.command("list")
def key_list(
    user: str = typer.Option("", help="Only this user's keys"),
    json_out: bool = JSON_OUT,
) -> None:
    """List keys (their id, owner, prefix and state; never the key itself)."""
    from paddock_controlplane.resources import accounts
    from paddock_core.timeutil import rfc3339

    async def work(session: Any, _: Any) -> list[dict[str, Any]]:
        return [
            {
                "id": k.id,
                "user_id": k.user_id,
                "prefix": k.prefix,
                "created_at": rfc3339(k.created_at),
                "revoked": k.revoked_at is not None,
            }
            for k in await accounts.list_keys(session, user or None)
        ]

    rows = _run(work)
    if json_out:
        emit_json(rows)
        return
    for row in rows:
        state = "revoked" if row["revoked"] else "active"
        typer.echo(f"{row['id']}  {row['user_id']}  {row['prefix']}…  {state}  {row['created_at']}")


@host_app.command("list")
def host_list(json_out: bool = JSON_OUT) -> None:
    """Every host: status (active, draining, dead), free memory, sandboxes, address and labels."""
    from paddock_controlplane.hosts import hosts

    async def work(session: Any, _: Any) -> list[dict[str, Any]]:
        rows, _total = await hosts.list_hosts(session, limit=10_000, offset=0)
        return [{**hosts.host_view(h), "url": h.url, "labels": dict(h.labels or {})} for h in rows]

    rows = _run(work)
    if json_out:
        emit_json(rows)
        return
    for row in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(row["labels"].items()))
        typer.echo(
            f"{row['id']}  {row['status']}  {row['free_mib']} MiB free  {row['vm_count']} sandboxes"
            f"  {row['url']}  {labels}"
        )


def _set_drained(host_id: str, drained: bool) -> str:
    from paddock_controlplane.hosts import hosts

    async def work(session: Any, _: Any) -> str:
        return str((await hosts.set_drained(session, host_id, drained)).status)

    return _run(work)


def _show_host_status(host_id: str, status: str, json_out: bool) -> None:
    if json_out:
        emit_json({"id": host_id, "status": status})
    else:
        typer.echo(f"host {host_id} is now {status}")


@host_app.command("drain")
def host_drain(host_id: str, json_out: bool = JSON_OUT) -> None:
    """No new sandboxes on this host (creates go elsewhere); the ones it runs keep running."""
    _show_host_status(host_id, _set_drained(host_id, True), json_out)


@host_app.command("undrain")
def host_undrain(host_id: str, json_out: bool = JSON_OUT) -> None:
    """Put a drained host back in service."""
    _show_host_status(host_id, _set_drained(host_id, False), json_out)
