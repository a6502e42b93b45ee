"""``paddock serve`` as a user starts it: the banner names the ingress URL, and that URL answers with curl.

Everything runs on its own ports, data dir, subnet and nftables table, so it does not meet a ``make run``
on the same machine.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.hostagent.conftest import debian_image, image_cache, private_subnet
from tests.network.ingress_support import start_app
from tests.ports import free_port

__all__ = ["debian_image"]

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_serve_prints_a_working_ingress_url(debian_image: Path, tmp_path: Path) -> None:
    names = ("CP", "HOST", "GW", "CP_INGRESS", "CP_INGRESS_TLS", "CP_SSH", "CP_E2B", "CP_E2B_EDGE")
    ports = {name: free_port() for name in names}
    nft_table = f"pdkserve{secrets.token_hex(3)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PADDOCK_")}
    env.update({f"PADDOCK_{name}_PORT": str(port) for name, port in ports.items()})
    env.update(
        {
            "PADDOCK_DATA_DIR": str(tmp_path),
            "PADDOCK_HOST_SUBNET": private_subnet(),
            "PADDOCK_HOST_NFT_TABLE": nft_table,
            "PADDOCK_HOST_IMAGE_DIR": str(image_cache()),
            "PADDOCK_HOST_POOL_SIZE": "0",
        }
    )
    out_path = tmp_path / "serve.out"
    with open(out_path, "wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "paddock_cli.main", "serve"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 240
        while "Stop with Ctrl-C." not in out_path.read_text(errors="replace"):
            assert serve.poll() is None, _failure(out_path.read_text(errors="replace"), ports)
            assert time.monotonic() < deadline, "serve did not start"
            time.sleep(0.5)
        banner = out_path.read_text()
        ingress_port = ports["CP_INGRESS"]
        assert f"ingress        http://<port>-<sandbox id>.sandbox.localhost:{ingress_port}" in banner
        tls_port = ports["CP_INGRESS_TLS"]
        assert f"ingress TLS    https://<port>-<sandbox id>.sandbox.localhost:{tls_port}" in banner
        ca_file = tmp_path / "tls" / "ca.pem"
        assert f"ingress CA     {ca_file}" in banner and ca_file.is_file()
        assert (tmp_path / "tls" / "ingress-key.pem").stat().st_mode & 0o077 == 0
        assert f"ssh -p {ports['CP_SSH']} <sandbox id or name>@127.0.0.1" in banner
        assert f"E2B API        http://127.0.0.1:{ports['CP_E2B']}" in banner
        with socket.create_connection(("127.0.0.1", ports["CP_SSH"]), timeout=10) as ssh_gateway:
            assert ssh_gateway.recv(64).startswith(b"SSH-2.0-")  # serve started the SSH gateway
        key = (tmp_path / "bootstrap-api-key").read_text().strip()
        with httpx.Client(
            base_url=f"http://127.0.0.1:{ports['CP']}", headers={"X-API-Key": key}, timeout=120
        ) as http:
            created = http.post(
                "/v1/sandboxes", json={"shape": "s-1vcpu-256mb", "disk_mib": 2048, "ingress_enabled": True}
            )
            assert created.status_code == 200, created.text
            sandbox = created.json()["data"]
            template = sandbox["ingress_url_template"]
            assert template == f"https://<port>-{sandbox['id']}.sandbox.localhost:{tls_port}"
            start_app(http, sandbox["id"], port=3000)
            url = template.replace("<port>", "3000") + "/hello"
            host = f"3000-{sandbox['id']}.sandbox.localhost"
            # HTTPS with verification on against the generated CA: curl, then httpx
            curl = subprocess.run(
                ["curl", "-sS", "--max-time", "20", "--cacert", str(ca_file),
                 "--resolve", f"{host}:{tls_port}:127.0.0.1", "-w", "%{http_version}", url],
                capture_output=True,
                text=True,
            )  # fmt: skip
            # curl offers h2 by ALPN and the ingress serves it (HTTP/1.1 over TLS: tests/network/test_ingress.py)
            assert curl.stdout.startswith("hello from ") and curl.stdout.endswith("2"), (
                curl.stdout,
                curl.stderr,
            )
            untrusted = subprocess.run(
                ["curl", "-sS", "--max-time", "20", "--resolve", f"{host}:{tls_port}:127.0.0.1", url],
                capture_output=True,
                text=True,
            )
            assert untrusted.returncode == 60, untrusted.stderr  # without the CA: not trusted
            context = ssl.create_default_context(cafile=str(ca_file))
            with httpx.Client(verify=context, timeout=20) as tls_client:
                fetched = tls_client.get(
                    f"https://127.0.0.1:{tls_port}/hello",
                    headers={"Host": host},
                    extensions={"sni_hostname": host},
                )
            assert fetched.status_code == 200 and fetched.text.startswith("hello from ")
            alpn = ssl.create_default_context(cafile=str(ca_file))
            alpn.set_alpn_protocols(["h2", "http/1.1"])
            with (
                socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw,
                alpn.wrap_socket(raw, server_hostname=host) as tls_socket,
            ):
                assert tls_socket.selected_alpn_protocol() == "h2"
            # plain HTTP stays on loopback
            plain = subprocess.run(
                ["curl", "-s", "--max-time", "20", f"http://{host}:{ingress_port}/hello"],
                capture_output=True,
                text=True,
            )
            assert plain.stdout.startswith("hello from "), (plain.stdout, plain.stderr)
            assert http.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 200
            deadline = time.monotonic() + 60
            while http.get(f"/v1/sandboxes/{sandbox['id']}").json()["data"]["status"] != "destroyed":
                assert time.monotonic() < deadline, "sandbox was not destroyed"
                time.sleep(0.2)
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
        subprocess.run(["nft", "delete", "table", "ip", nft_table], check=False, capture_output=True)
        subprocess.run(
            ["nft", "delete", "table", "ip", f"{nft_table}_egress"], check=False, capture_output=True
        )


def _failure(output: str, ports: dict[str, int]) -> str:
    """What a serve that exited before its banner said: its error lines first (a child's bind error
    names its address, and the other children's shutdown logs pushed it out of a plain tail), then
    the ports this test gave each service, then the tail."""
    errors = [
        line for line in output.splitlines() if "Errno" in line or "rror" in line or "exited with" in line
    ]
    return "\n".join([*errors[:40], f"ports given: {ports}", output[-3000:]])
