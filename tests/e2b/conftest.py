"""The E2B suites' platform: a live Paddock (control plane and host agent processes, real sandboxes) with
its E2B API and sandbox edge listening on free loopback ports, and the three environment variables an
E2B user sets to switch to it. The SDKs under test (``e2b``, ``e2b-code-interpreter``: pyproject's test
extra) run unmodified and are configured only by these variables."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from e2b import Sandbox
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, plain_http_ingress, start_platform
from tests.ports import free_port

__all__ = ["debian_image", "guest_binary_dir"]


@dataclass(frozen=True)
class E2bPlatform:
    platform: LivePlatform
    api_url: str
    sandbox_url: str
    api_key: str

    @property
    def env(self) -> dict[str, str]:
        """What a user exports to point an existing E2B program at Paddock (docs/e2b.md)."""
        return {"E2B_API_URL": self.api_url, "E2B_SANDBOX_URL": self.sandbox_url, "E2B_API_KEY": self.api_key}


@pytest.fixture(scope="package")
def e2b_platform(debian_image: Path, guest_binary_dir: Path) -> Iterator[E2bPlatform]:
    api_port, edge_port = free_port(), free_port()
    cp_env = {
        **plain_http_ingress(),
        "PADDOCK_CP_E2B_PORT": str(api_port),
        "PADDOCK_CP_E2B_EDGE_PORT": str(edge_port),
    }
    platform = start_platform(guest_binary_dir, cp_env=cp_env)
    try:
        yield E2bPlatform(
            platform=platform,
            api_url=f"http://127.0.0.1:{api_port}",
            sandbox_url=f"http://127.0.0.1:{edge_port}",
            api_key=platform.api_key(),
        )
    finally:
        platform.stop()


#: E2B's variables a test's environment holds only when it sets them itself.
E2B_VARIABLES = ("E2B_API_URL", "E2B_API_KEY", "E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG", "SSL_CERT_FILE")


@contextlib.contextmanager
def exported(variables: dict[str, str]) -> Iterator[None]:
    """``variables`` exported, and E2B's others (:data:`E2B_VARIABLES`) unset, until the block ends;
    then the environment is as it was."""
    names = {*E2B_VARIABLES, *variables}
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="package")
def e2b_env(e2b_platform: E2bPlatform) -> Iterator[E2bPlatform]:
    """The three variables exported for the session (and nothing else of E2B's: no E2B_DOMAIN)."""
    with exported(e2b_platform.env):
        yield e2b_platform


@pytest.fixture(scope="module")
def sandbox(e2b_env: E2bPlatform) -> Iterator[Sandbox]:
    """A plain E2B sandbox each test module shares (test_edge_interpreter's is a code interpreter's)."""
    made = Sandbox.create(timeout=600)
    try:
        yield made
    finally:
        made.kill()


def wait_template_ready(http: httpx.Client, template_id: str, timeout_s: float = 300) -> None:
    """Waits until the ``/v1`` template's build ends, and asserts that it is ready."""
    deadline = time.monotonic() + timeout_s
    status = ""
    while time.monotonic() < deadline:
        status = http.get(f"/v1/templates/{template_id}").json()["data"]["status"]
        if status in ("ready", "failed"):
            break
        time.sleep(1)
    assert status == "ready", status
