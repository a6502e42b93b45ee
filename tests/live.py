"""The whole platform on loopback, as separate processes: a control plane and real host agents.

``LivePlatform`` starts ``paddock controlplane`` (SQLite file in its state dir) and host agents that
register with it, exactly as an operator would run them on several machines. Tests talk to it only
through HTTP (raw httpx or the SDK), can stop and restart either process, and make users with
``new_user()`` (the domain call the admin CLI makes). Used by tests/integration, tests/sdk, tests/cli,
the networking tests and ``bench/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from paddock_hostagent.images import ImageStore
from tests.hostagent.conftest import (
    STARTUP_TIMEOUT_S,
    TOKEN,
    AgentProcess,
    image_cache,
    restart_if_killed,
    teardown_agent,
)
from tests.ports import free_port
from tests.sweep import KEEP_MARKER, OwnerLock


@dataclass
class ControlPlaneProcess:
    """``paddock controlplane`` as a child process (env ``PADDOCK_CP_*``)."""

    state_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    # Held from start() until remove(): this test process owns the state dir, even while the control
    # plane is stopped (tests/sweep.py leaves it alone meanwhile, and removes it once this process is gone).
    owner: OwnerLock | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def database_url(self) -> str:
        return f"sqlite+aiosqlite:///{self.state_dir / 'controlplane.db'}"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "controlplane.log"

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
        env.update(
            {
                "PADDOCK_CP_HOST": "127.0.0.1",
                "PADDOCK_CP_PORT": str(self.port),
                "PADDOCK_CP_DATA_DIR": str(self.state_dir),
                "PADDOCK_CP_DATABASE_URL": self.database_url,
                "PADDOCK_CP_HOST_TOKEN": TOKEN,
                "PADDOCK_CP_SECRET_KEY": "live-test-secret-key-0123456789",
                "PADDOCK_CP_REGION": "eu",
                "PADDOCK_CP_RECONCILE_INTERVAL_S": "0.2",
                "PADDOCK_CP_HOST_DEAD_AFTER_S": "15",  # the production default; restarts under load take seconds
                "PADDOCK_CP_LOG_JSON": "true",
            }
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.owner is None:
            self.owner = OwnerLock(self.state_dir, {})
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop(signal.SIGKILL)  # one that did not come up is not left running
            raise

    def _start(self, timeout_s: float) -> None:
        self.port = self.port or free_port()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "paddock_cli.main", "controlplane"], env=self.env(), stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"control plane exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"control plane did not start:\n{self.log_tail()}")

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def remove(self) -> None:
        """Removes the state dir this process made (database, log, E2B files), once stopped.

        PADDOCK_TEST_KEEP=1 keeps it for debugging: it is marked ``KEPT`` (the session-start sweep then
        leaves it alone too) and its path printed; removing it is then the developer's job."""
        if self.owner is None:  # never started here: not ours to remove
            return
        if os.environ.get("PADDOCK_TEST_KEEP") == "1":
            (self.state_dir / KEEP_MARKER).touch()
            print(f"control plane state kept (PADDOCK_TEST_KEEP=1): {self.state_dir}")
        else:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        self.owner.release()
        self.owner = None


@dataclass
class LivePlatform:
    """A control plane plus host agents registered with it."""

    controlplane: ControlPlaneProcess
    agents: list[AgentProcess]

    @property
    def url(self) -> str:
        return self.controlplane.url

    def new_user(self, plan: str = "pro", credits: int = 500) -> tuple[str, str]:
        """A user and an API key made through the domain, as ``paddock admin user create`` does."""
        from paddock_controlplane.resources import accounts
        from paddock_core.db import make_engine, make_sessionmaker, transaction

        async def make() -> tuple[str, str]:
            engine = make_engine(self.controlplane.database_url)
            try:
                async with transaction(make_sessionmaker(engine)) as session:
                    user = await accounts.create_user(session, plan_id=plan, signup_credits=credits)
                    key = await accounts.create_key(session, user.id)
                return user.id, key.plaintext
            finally:
                await engine.dispose()

        return asyncio.run(make()) if not _loop_running() else _run_in_thread(make)

    def api_key(self, plan: str = "pro", credits: int = 500) -> str:
        return self.new_user(plan, credits)[1]

    def http(self, api_key: str, **options: Any) -> httpx.Client:
        options.setdefault("timeout", 120)
        return httpx.Client(base_url=self.url, headers={"X-API-Key": api_key}, **options)

    def wait_for_hosts(self, count: int | None = None, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Until the control plane lists ``count`` active hosts that report a cached image."""
        wanted = len(self.agents) if count is None else count
        key = self.api_key()
        deadline = time.monotonic() + timeout_s
        with self.http(key) as http:
            while time.monotonic() < deadline:
                items = http.get("/v1/hosts").json()["data"]["data"]
                ready = [h for h in items if h.get("status") == "active" and h.get("rootfses")]
                if len(ready) >= wanted:
                    return
                time.sleep(0.1)
        raise RuntimeError(f"hosts did not register:\n{self.controlplane.log_tail()}")

    def add_agent(self, agent: AgentProcess) -> AgentProcess:
        agent.controlplane_url = self.url
        self.agents.append(agent)  # before start(): stop() tears down one that failed to start, too
        agent.start()
        return agent

    def stop(self) -> None:
        """Destroys every sandbox the agents still run, then stops everything, checks for leftovers and
        removes the state dirs; every agent and the control plane go even when one teardown fails."""
        problems: list[str] = []
        try:
            for agent in self.agents:
                try:
                    restart_if_killed(agent)  # a killed agent comes back to release what it adopted
                    teardown_agent(agent)
                except AssertionError as leftover:
                    problems.append(str(leftover))
                except Exception as error:
                    problems.append(repr(error))
        finally:
            self.controlplane.stop()
            for line in self.controlplane.log_tail(100_000).splitlines():
                if '"level": "error"' in line or "Traceback" in line:
                    print(f"control plane: {line}")  # shown with a failing test, before the log goes
            try:
                self._remove_templates()
            finally:
                self.controlplane.remove()
        assert not problems, problems

    def _remove_templates(self) -> None:
        """Removes the templates this platform built from the shared image cache, with their builds'
        work dirs: they outlive the agents (CI runs on one machine), and only this platform's
        database names them, so another run's templates are never touched."""
        from sqlalchemy import select

        from paddock_controlplane.records.models import Template
        from paddock_core.db import make_engine, make_sessionmaker, transaction

        async def template_ids() -> list[str]:
            engine = make_engine(self.controlplane.database_url)
            try:
                async with transaction(make_sessionmaker(engine)) as session:
                    return list((await session.scalars(select(Template.id))).all())
            finally:
                await engine.dispose()

        try:
            ids = asyncio.run(template_ids()) if not _loop_running() else _run_in_thread(template_ids)
        except Exception:  # no database: the control plane never started, so nothing was built
            return
        store = ImageStore(image_cache())
        for template_id in ids:
            store.remove_template(template_id)
            for work in (image_cache() / ".builds").glob(f"{template_id}-*"):
                shutil.rmtree(work, ignore_errors=True)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_in_thread(factory: Any) -> Any:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def plain_http_ingress() -> dict[str, str]:
    """Control-plane settings for an ingress proxy on plain HTTP at 127.0.0.1:<free port>, with URLs
    ``http://<port>-<sandbox id>.sandbox.localhost:<ingress port>`` as ``paddock serve`` makes them."""
    return {
        "PADDOCK_CP_INGRESS_PORT": str(free_port()),
        "PADDOCK_CP_INGRESS_SCHEME": "http",
        "PADDOCK_CP_INGRESS_DOMAIN": "sandbox.localhost",
    }


def start_platform(
    guest_dir: Path,
    *,
    agents: int = 1,
    cp_env: dict[str, str] | None = None,
    agent_options: dict[str, Any] | None = None,
) -> LivePlatform:
    """Starts a control plane and ``agents`` host agents; the caller must call ``stop()``."""
    tag = secrets.token_hex(3)
    controlplane = ControlPlaneProcess(state_dir=Path(f"/tmp/pdkcp-{tag}"), extra_env=dict(cp_env or {}))
    platform = LivePlatform(controlplane=controlplane, agents=[])
    try:
        controlplane.start()
        for index in range(agents):
            options = {"pool_size": 2, **(agent_options or {})}
            platform.add_agent(
                AgentProcess(state_dir=Path(f"/tmp/pdkt-{tag}{index}"), guest_dir=guest_dir, **options)
            )
        platform.wait_for_hosts()
    except BaseException:
        platform.stop()
        raise
    return platform
