"""E2B's own addressing, without ``E2B_SANDBOX_URL`` (which the SDK deprecates, to drop in its next major
version): the unmodified ``e2b`` SDK reaches a sandbox's envd at ``https://49983-<id>.<domain>``, the
domain the API tells it, which is Paddock's ingress over TLS; the ingress hands envd's and the code
interpreter's ports to the E2B edge of its process.

The program is ``domain_mode_client.py``, run in a process of its own with only ``E2B_API_URL``,
``E2B_API_KEY`` and ``SSL_CERT_FILE`` set before it starts (the SDK's envd client reads its trusted
certificates once, at its first use, so a test process that used the SDK before could not change
them). The ingress has the certificate ``paddock serve`` makes, whose CA that file is, and the program
resolves the wildcard name to 127.0.0.1 as a DNS record for it would: the one stand-in.

Signed file URLs (``download_url``/``upload_url``) open ``/files`` without the token, as envd's do: for
the path, user and operation signed, until their expiration.

The JS SDKs (``e2b`` and ``@e2b/code-interpreter`` from npm) run the same way in ``js/domain.mjs``, with
``NODE_EXTRA_CA_CERTS`` for the CA, which Node reads at its start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from paddock_cli.localca import ensure_local_ca
from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import E2B_VARIABLES
from tests.hostagent.conftest import image_cache
from tests.live import start_platform
from tests.network.ingress_support import DOMAIN
from tests.ports import free_port

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLIENT = Path(__file__).with_name("domain_mode_client.py")
JS = Path(__file__).with_name("js")


@pytest.fixture(scope="module")
def seen(
    debian_image: Path, guest_binary_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """What ``domain_mode_client.py`` saw, run once against a platform whose ingress serves HTTPS."""
    ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build
    # The CA and certificate ``paddock serve`` makes: what a user of it trusts with SSL_CERT_FILE.
    tls = ensure_local_ca(tmp_path_factory.mktemp("data"), DOMAIN)
    api_port = free_port()
    live = start_platform(
        guest_binary_dir,
        cp_env={
            "PADDOCK_CP_INGRESS_SCHEME": "https",
            "PADDOCK_CP_INGRESS_DOMAIN": DOMAIN,
            "PADDOCK_CP_INGRESS_TLS_PORT": str(free_port()),
            "PADDOCK_CP_INGRESS_TLS_CERT_FILE": str(tls.cert_file),
            "PADDOCK_CP_INGRESS_TLS_KEY_FILE": str(tls.key_file),
            "PADDOCK_CP_E2B_PORT": str(api_port),
            "PADDOCK_CP_E2B_EDGE_PORT": str(free_port()),
        },
    )
    try:
        env = {name: value for name, value in os.environ.items() if name not in E2B_VARIABLES}
        env |= {
            "E2B_API_URL": f"http://127.0.0.1:{api_port}",
            "E2B_API_KEY": live.api_key(),
            "SSL_CERT_FILE": str(tls.ca_file),
        }
        ran = subprocess.run(
            [sys.executable, str(CLIENT), DOMAIN], env=env, capture_output=True, text=True, timeout=240
        )
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
        python_seen = json.loads(ran.stdout.strip().splitlines()[-1])
        # The JS SDKs trust a CA from NODE_EXTRA_CA_CERTS, which Node reads at its start.
        node = shutil.which("node")
        assert node is not None, "node is needed (scripts/setup-host.sh installs it)"
        env = {name: value for name, value in env.items() if name != "SSL_CERT_FILE"}
        ran = subprocess.run(
            [node, "domain.mjs", DOMAIN],
            cwd=JS,
            env=env | {"NODE_EXTRA_CA_CERTS": str(tls.ca_file)},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-5000:]
        yield {**python_seen, "js": json.loads(ran.stdout.strip().splitlines()[-1])}
    finally:
        live.stop()


def test_the_sdk_reaches_envd_at_e2bs_own_address_through_the_ingress(seen: Any) -> None:
    assert seen["envd_url"].startswith(f"https://49983-{seen['sandbox_id']}.{DOMAIN}:"), seen
    assert seen["run"] == "42\n"  # a server-streaming Connect call through TLS, HTTP/2 and the ingress
    assert seen["read"] == "through the ingress" and seen["listed"] == ["domain.txt"]


def test_a_signed_url_opens_its_file_and_nothing_else(seen: Any) -> None:
    """What ``download_url`` and ``upload_url`` give (to a browser or another service, without the token)
    works for its own path and operation; a URL changed in any part, or past its expiration, is 401."""
    assert seen["signed_read"] == [200, "signed for you"], seen
    assert seen["signed_write"][0] == 200 and seen["uploaded"] == "sent without a token", seen
    for case, (status, message) in seen["refused"].items():
        assert status == 401, (case, status, message)
        assert "signature" in message or "X-Access-Token" in message, (case, message)
    assert "expired" in seen["refused"]["expired"][1]


def test_the_code_interpreter_is_reached_at_its_own_address_too(seen: Any) -> None:
    assert seen["run_code"] == "42"  # https://49999-<id>.<domain>/execute


def test_the_js_sdks_reach_envd_and_the_code_interpreter_at_e2bs_own_addresses(seen: Any) -> None:
    """``e2b`` and ``@e2b/code-interpreter`` from npm (``js/domain.mjs``), the same way."""
    js = seen["js"]
    assert js["host"].startswith(f"49983-{js['sandboxId']}.{DOMAIN}"), js
    assert js["run"] == "42\n" and js["read"] == "through the ingress, from node", js
    assert js["listed"] == ["js-domain.txt"] and js["runCode"] == "42", js
