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
        platform.stop()
        shutil.rmtree(own_images, ignore_errors=True)


async def test_a_host_fetches_a_template_it_lacks_and_boots_it(
    two_hosts: tuple[LivePlatform, dict[str, Any], str],
) -> None:
    platform, template, key = two_hosts
    builder, second = platform.agents
    own_images = Path(second.extra_env["PADDOCK_HOST_IMAGE_DIR"])
    assert not (own_images / template["id"]).exists()

    client = HostAgentClient(second.url, TOKEN)
    try:
        with pytest.raises(HostAgentError):  # only templates travel, and only from a host that has them
            await client.fetch_image("debian:13", builder.url)
        with pytest.raises(HostAgentError):
            await client.fetch_image("tpl_00000000000000000000000000", builder.url)
        fetched = await client.fetch_image(template["id"], builder.url)
        assert fetched.image == template["id"] and fetched.ext4_size_bytes == template["ext4_size_bytes"]
        again = await client.fetch_image(template["id"], builder.url)  # already here: at once
        assert again.image == template["id"]
    finally:
        await client.aclose()
    assert (own_images / template["id"] / "image.json").is_file()

    # The public API places a sandbox of the template on the second host, which boots its own copy.
    with platform.http(key) as http:
        host_id = f"test-{second.nft_table}"
        deadline = time.monotonic() + 15
        while True:  # the second host lists the image from its next heartbeat on
            created = http.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-1gb", "rootfs": template["id"], "host_id": host_id}
            )
            if created.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert created.status_code == 200, created.text
        sandbox = created.json()["data"]
        try:
            assert second.record(sandbox["id"])["image"] == template["id"]  # on the second host
            out = sh(http, sandbox["id"], 'cat /marker.txt; echo "$CARRIED"')
            assert out["stdout"].splitlines() == ["carried-between-hosts", "yes"], out
        finally:
            http.delete(f"/v1/sandboxes/{sandbox['id']}")
