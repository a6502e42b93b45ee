"""Fixtures shared by every test package: databases on both engines, real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import shutil
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from paddock_core import serving
from paddock_core.db import upgrade
from tests import sweep
from tests.ports import free_port

ENGINES = ("sqlite", "postgresql")
_SWEPT = pytest.StashKey[list[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Removes what earlier test runs that died part-way left in /tmp (host agents' and control planes'
    state dirs, with their mounts, loop devices, netns and nft tables), and only when their owners are
    provably gone: other runs on this machine may be going on right now (tests/sweep.py says how)."""
    try:
        swept = sweep.sweep()
    except Exception as error:  # never stop a session over another run's leftovers
        swept = [f"the sweep failed: {error!r}"]
    session.config.stash[_SWEPT] = swept


def pytest_report_header(config: pytest.Config) -> list[str]:
    swept = config.stash.get(_SWEPT, [])
    if not swept:
        return []
    return [f"leftovers of dead test runs removed ({len(swept)}): " + ", ".join(swept)]


def pg_admin_url() -> str:
    url = os.environ.get("PADDOCK_TEST_PG_URL", "")
    if not url:
        pytest.fail(
            "PADDOCK_TEST_PG_URL is not set: database tests run on SQLite and PostgreSQL. "
            "Run them through `make test`, or export the URL printed by scripts/ensure-postgres.sh."
        )
    return url


async def _pg_execute(admin_url: str, sql: str) -> None:
    import asyncpg

    dsn = admin_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _pg_url(admin: str, name: str) -> str:
    """The URL of database ``name`` on the cluster of the admin URL ``admin``."""
    return admin.rsplit("/", 1)[0] + "/" + name


@asynccontextmanager
async def _pg_database(template: str | None = None) -> AsyncIterator[str]:
    """A new PostgreSQL test database, empty or a copy of ``template``; dropped afterwards."""
    admin = pg_admin_url()
    name = "t_" + secrets.token_hex(6)
    await _pg_execute(admin, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield _pg_url(admin, name)
    finally:
        await _pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@asynccontextmanager
async def fresh_database(engine: str, tmp_path: Path) -> AsyncIterator[str]:
    """A brand-new empty database on ``engine``; dropped afterwards."""
    if engine == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'test.db'}"
        return
    async with _pg_database() as url:
        yield url


class SchemaTemplates:
    """Databases this process migrated once, one per engine and migrations directory, that a test's new
    database starts as a copy of. Running the control plane's migrations took ~0.6 s of a test's setup on
    SQLite, where a file copy takes a millisecond; on PostgreSQL, measured beside a loaded run, an empty
    CREATE DATABASE and the migrations took 1.55 s (0.4 s idle), a ``CREATE DATABASE … TEMPLATE`` 0.26 s
    and the migrations' no-op on the copy 0.13 s.

    Each process makes its own (xdist workers are processes; other runs share the PostgreSQL cluster), so
    no two ever copy one template at once: PostgreSQL refuses a template anyone else is connected to.
    For the same reason the template takes no connections once migrated (the migrating engine is
    disposed by then). ``pytest_sessionfinish`` drops them."""

    def __init__(self) -> None:
        self.sqlite: dict[Path, Path] = {}
        self.postgresql: dict[Path, str] = {}

    async def sqlite_file(self, migrations: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
        if migrations not in self.sqlite:
            template = tmp_path_factory.mktemp("schema") / "migrated.db"
            await upgrade(migrations, f"sqlite+aiosqlite:///{template}")
            self.sqlite[migrations] = template
        return self.sqlite[migrations]

    async def postgresql_name(self, migrations: Path) -> str:
        if migrations not in self.postgresql:
            admin = pg_admin_url()
            name = "t_tpl_" + secrets.token_hex(6)
            await _pg_execute(admin, f"CREATE DATABASE {name}")
            try:
                await upgrade(migrations, _pg_url(admin, name))
                await _pg_execute(admin, f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
            except BaseException:
                await _pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                raise
            self.postgresql[migrations] = name
        return self.postgresql[migrations]

    async def drop(self) -> None:
        admin = pg_admin_url()
        while self.postgresql:
            _, name = self.postgresql.popitem()
            await _pg_execute(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


_TEMPLATES = SchemaTemplates()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _TEMPLATES.postgresql:
        try:
            asyncio.run(_TEMPLATES.drop())
        except Exception as error:  # a dead cluster must not hide the session's outcome
            print(f"\ncould not drop the session's template databases: {error!r}", file=sys.stderr)


@asynccontextmanager
async def migrated_database(
    engine: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, migrations: Path
) -> AsyncIterator[str]:
    """A new database on ``engine`` already at the head of ``migrations``, a copy of the process's
    template (``SchemaTemplates``); dropped afterwards. Callers still migrate it, a no-op that shows the
    copy is at head."""
    if engine == "sqlite":
        target = tmp_path / "test.db"
        shutil.copyfile(await _TEMPLATES.sqlite_file(migrations, tmp_path_factory), target)
        yield f"sqlite+aiosqlite:///{target}"
        return
    async with _pg_database(template=await _TEMPLATES.postgresql_name(migrations)) as url:
        yield url


@pytest.fixture(params=ENGINES)
def db_engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def database_url(db_engine: str, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database, for tests of migrations themselves."""
    async with fresh_database(db_engine, tmp_path) as url:
        yield url


@pytest.fixture
async def cp_database_url(
    db_engine: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """A database with the control plane's schema at head (``migrated_database``)."""
    # Imported here, not at the top: the control plane's app takes ~1.7 s to import, which every test
    # process (each xdist worker, a run of tests/core alone) would otherwise pay at start-up.
    from paddock_controlplane.app import MIGRATIONS

    async with migrated_database(db_engine, tmp_path, tmp_path_factory, MIGRATIONS) as url:
        yield url


class LiveServer:
    """A real uvicorn server for an ASGI app on 127.0.0.1 and an ephemeral port."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.task: asyncio.Task[None] | None = None
        self.url = ""

    #: A start-up this slow is stuck: fail naming where each task waits, rather than at the test's timeout.
    START_TIMEOUT_S = 120.0

    async def __aenter__(self) -> LiveServer:
        self.task = asyncio.create_task(self.server.serve())
        deadline = asyncio.get_running_loop().time() + self.START_TIMEOUT_S
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("server exited during start-up")
            if asyncio.get_running_loop().time() > deadline:
                stacks = _task_stacks()
                self.task.cancel()
                raise RuntimeError(f"server not started after {self.START_TIMEOUT_S:.0f}s:\n{stacks}")
            await asyncio.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task:
            await self.task


@dataclass
class ThreadedService:
    url: str
    server: serving.FrozenHeapServer
    thread: threading.Thread


@contextmanager
def service_in_thread(app: Any) -> Iterator[ThreadedService]:
    """``app`` served as ``paddock_core.serving.serve`` serves a service (its uvicorn settings, its
    keep-alive), on a loopback port, in a thread with its own event loop: it goes on answering, and
    closing idle connections, while the test's own loop is held. Stopped afterwards."""
    port = free_port()
    server = serving.FrozenHeapServer(serving.config(app, "127.0.0.1", port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start within 10 s"
    try:
        yield ThreadedService(f"http://127.0.0.1:{port}", server, thread)
    finally:
        server.should_exit = True
        thread.join(10)


def _task_stacks() -> str:
    """Where each of the loop's tasks waits, and each thread (a start-up stuck on a CI run once)."""
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=12, file=out)
    for ident, frame in sys._current_frames().items():
        out.write(f"thread {ident}:\n{''.join(traceback.format_stack(frame, limit=12))}")
    return out.getvalue()


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings come from the environment; keep a developer's PADDOCK_* variables out of tests."""
    for key in list(os.environ):
        if key.startswith(("PADDOCK_CP_", "PADDOCK_GW_", "PADDOCK_HOST_", "PADDOCK_API", "PADDOCK_BASE")):
            monkeypatch.delenv(key, raising=False)
    yield
