"""Uploads with a Dockerfile deploy for real: the gateway on anvil, a live control plane and host agent with
buildah (``tests/live.py``). The Dockerfile is built into a template with the upload as its build
context (COPY), a sandbox boots from it, and the app it starts serves at the deployment's URL.

RUN steps fetch from the Debian archive (apt-get), as the template tests do.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from tests.gateway.conftest import Gateway, Wallet, new_wallet, unique_name
from tests.gateway.test_live_deploy import (
    cp_key,
    fetch,
    live_gateway,
    pay_and_deploy,
    project,
    sandbox_of,
    sandbox_view,
)
from tests.hostagent.conftest import debian_image, guest_binary_dir
from tests.live import LivePlatform, plain_http_ingress, start_platform

__all__ = ["cp_key", "debian_image", "guest_binary_dir", "live_gateway"]

pytestmark = [pytest.mark.root, pytest.mark.chain, pytest.mark.slow]

SERVER = """\
import http.server, os, pathlib
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ' '.join([
            os.environ['GREETING'],
            pathlib.Path('static/page.txt').read_text().strip(),
            'cwd=' + os.getcwd(),
            'secret=' + str(os.environ.get('API_TOKEN') == os.environ.get('EXPECTED')),
        ]).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
http.server.HTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()
"""
DOCKERFILE = """\
FROM debian:13
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/app
COPY server.py ./
COPY static/ ./static/
ENV GREETING="hello from a Dockerfile"
CMD ["python3", "server.py"]
"""


@pytest.fixture(scope="module")
def live(debian_image: Path, guest_binary_dir: Path) -> Iterator[LivePlatform]:
    """The platform with buildah on its host agent and the ingress proxy on 127.0.0.1, as in
    test_live_deploy."""
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: scripts/setup-host.sh installs it")
    platform = start_platform(guest_binary_dir, cp_env=plain_http_ingress())
    try:
        yield platform
    finally:
        platform.stop()


async def test_an_upload_with_a_dockerfile_is_built_booted_and_served(
    live_gateway: Gateway, paying_wallet: Wallet, live: LivePlatform, cp_key: str
) -> None:
    secret = "s3cr3t-" + uuid.uuid4().hex
    body = project(
        unique_name("docker"),
        {
            "Dockerfile": DOCKERFILE,
            "server.py": SERVER,
            "static/page.txt": "copied-from-the-upload\n",
            "README.md": "not copied anywhere",
        },
        port=8080,
        hasDockerfile=True,
        runEnvs={"API_TOKEN": secret, "EXPECTED": secret},
    )
    started = await pay_and_deploy(live_gateway, paying_wallet, body)
    final = await live_gateway.wait_terminal(
        paying_wallet, started["projectId"], started["deploymentId"], 600
    )
    assert final["status"] == "ready", final
    sandbox_id, port = sandbox_of(final["endpoint"])
    assert port == 8080
    assert fetch(final["endpoint"]) == (
        200,
        "hello from a Dockerfile copied-from-the-upload cwd=/srv/app secret=True",
    )
    # The sandbox runs the built image; the template itself is gone (it frees the platform's caps),
    # and the secret never reached the build or a log.
    view = sandbox_view(live, cp_key, sandbox_id)
    assert view["status"] == "running" and str(view["rootfs"]).startswith("tpl_")
    with live.http(cp_key) as http:
        assert http.get("/v1/templates").json()["data"]["pagination"]["total"] == 0
    assert secret not in live.controlplane.log_path.read_text(errors="replace")
    assert all(secret not in agent.log_path.read_text(errors="replace") for agent in live.agents)

    deleted = await live_gateway.http.delete(
        f"/agent/projects/{started['projectId']}", headers=live_gateway.auth(paying_wallet)
    )
    assert deleted.status_code == 200, deleted.text


async def test_a_dockerfile_that_fails_or_is_refused_fails_the_deployment_saying_why(
    live_gateway: Gateway, live: LivePlatform, cp_key: str
) -> None:
    wallet = new_wallet()
    await live_gateway.grant_credits(wallet, Decimal("20"))
    credits = {"X-Use-Existing-Credits": "true"}

    failing = project(
        unique_name("dfail"),
        {"Dockerfile": 'FROM debian:13\nRUN echo build-marker-77 && exit 4\nCMD ["true"]\n'},
        hasDockerfile=True,
    )
    started = (await live_gateway.deploy(wallet, failing, **credits)).json()
    final = await live_gateway.wait_terminal(wallet, started["projectId"], started["deploymentId"], 300)
    assert final["status"] == "failed", final
    assert final["reason"].startswith("the image build failed") and "build-marker-77" in final["reason"]

    refused = project(unique_name("dref"), {"Dockerfile": 'FROM scratch\nCMD ["x"]\n'}, hasDockerfile=True)
    started = (await live_gateway.deploy(wallet, refused, **credits)).json()
    final = await live_gateway.wait_terminal(wallet, started["projectId"], started["deploymentId"], 30)
    assert final["status"] == "failed"
    assert final["reason"].startswith("the platform refused the Dockerfile") and "scratch" in final["reason"]

    no_command = project(unique_name("dcmd"), {"Dockerfile": "FROM debian:13\n"}, hasDockerfile=True)
    started = (await live_gateway.deploy(wallet, no_command, **credits)).json()
    final = await live_gateway.wait_terminal(wallet, started["projectId"], started["deploymentId"], 30)
    assert final["status"] == "failed" and "no CMD or ENTRYPOINT" in final["reason"]
    with live.http(cp_key) as http:  # nothing left behind on the platform
        assert http.get("/v1/templates").json()["data"]["pagination"]["total"] == 0
