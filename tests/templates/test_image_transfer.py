"""Two host agents on one box: a template built on one is fetched by the other (``image_transfer.py``),
which then boots sandboxes of it. The second agent has an image directory of its own, holding only
debian:13 (hard links to the cache), so it really lacks the template until it fetches it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paddock_hostagent.client import HostAgentClient, HostAgentError
from tests.hostagent.conftest import TOKEN, AgentProcess, image_cache
from tests.live import LivePlatform, start_platform
from tests.templates.test_live_templates import sh, wait_done

pytestmark = [pytest.mark.root, pytest.mark.slow]

DOCKERFILE = "FROM debian:13\nRUN echo carried-between-hosts > /marker.txt\nENV CARRIED=yes\n"


@pytest.fixture(scope="module")
def two_hosts(
    debian_image: Path, guest_binary_dir: Path
) -> Iterator[tuple[LivePlatform, dict[str, Any], str]]:
    """The platform with one agent; a template built there; then a second agent with its own image dir."""
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: scripts/setup-host.sh installs it")
    platform = start_platform(guest_binary_dir)
    own_images = Path(f"{image_cache()}-second-{int(time.time())}")
    try:
        key = platform.api_key("pro")
        with platform.http(key, timeout=600) as http:
            created = http.post("/v1/templates", json={"name": "carried", "dockerfile": DOCKERFILE})
            assert created.status_code == 200, created.text
            template = wait_done(http, created.json()["data"]["id"])
            assert template["status"] == "ready", template
        own_images.mkdir()
        subprocess.run(["cp", "-al", str(debian_image.parent), str(own_images)], check=True)
        second = AgentProcess(
            # Not a prefix of the first agent's dir: teardown looks for leftovers by path prefix.
            state_dir=Path(f"/tmp/pdkt2-{secrets.token_hex(3)}"),
            guest_dir=guest_binary_dir,
            extra_env={"PADDOCK_HOST_IMAGE_DIR": str(own_images)},
        )
        platform.add_agent(second)
        platform.wait_for_hosts(2)
        yield platform, template, key
    finally:
        try:
            platform.stop()
        finally:
            shutil.rmtree(own_images, ignore_errors=True)


async def test_a_sandbox_placed_on_a_host_without_the_image_boots_there(
    two_hosts: tuple[LivePlatform, dict[str, Any], str],
) -> None:
    """The control plane places the sandbox on the second host (``host_id``): that host fetches the
    template's image from the builder first, then boots its own copy."""
    platform, template, key = two_hosts
    second = platform.agents[1]
    own_images = Path(second.extra_env["PADDOCK_HOST_IMAGE_DIR"])
    assert not (own_images / template["id"]).exists()
    with platform.http(key) as http:
        created = http.post(
            "/v1/sandboxes",
            json={"shape": "s-1vcpu-1gb", "rootfs": "carried", "host_id": f"test-{second.nft_table}"},
        )
        assert created.status_code == 200, created.text
        sandbox = created.json()["data"]
        try:
            assert second.record(sandbox["id"])["image"] == template["id"]  # on the second host
            assert (own_images / template["id"] / "image.json").is_file()
            out = sh(http, sandbox["id"], 'cat /marker.txt; echo "$CARRIED"')
            assert out["stdout"].splitlines() == ["carried-between-hosts", "yes"], out
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")


async def test_the_fetch_call_takes_only_templates_a_source_holds(
    two_hosts: tuple[LivePlatform, dict[str, Any], str],
) -> None:
    platform, template, _ = two_hosts
    builder, second = platform.agents
    client = HostAgentClient(second.url, TOKEN)
    try:
        with pytest.raises(HostAgentError, match="only templates"):
            await client.fetch_image("debian:13", builder.url)
        with pytest.raises(HostAgentError, match="404"):
            await client.fetch_image("tpl_00000000000000000000000000", builder.url)
        assert not (
            Path(second.extra_env["PADDOCK_HOST_IMAGE_DIR"]) / "tpl_00000000000000000000000000"
        ).exists()
        fetched = await client.fetch_image(template["id"], builder.url)  # already here: at once
        assert fetched.image == template["id"] and fetched.ext4_size_bytes == template["ext4_size_bytes"]
    finally:
        await client.aclose()
