"""Helpers for the ingress tests and bench: a platform with the ingress proxy on, and an app in a sandbox.

The app is ``sandbox_app.pl`` (perl-base is in the debian:13 image; python3 is not), uploaded through
the files API and started in the background with the exec API, exactly as a user would.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import httpx

from tests.live import LivePlatform, start_platform
from tests.ports import free_port

APP = Path(__file__).with_name("sandbox_app.pl")
APP_PORT = 8000
DOMAIN = "sandbox.localhost"


def start_ingress_platform(guest_dir: Path, **options: Any) -> tuple[LivePlatform, int]:
    """A LivePlatform whose control plane serves ingress on plain HTTP at 127.0.0.1:<port>."""
    port = free_port()
    cp_env = {
        "PADDOCK_CP_INGRESS_PORT": str(port),
        "PADDOCK_CP_INGRESS_SCHEME": "http",
        "PADDOCK_CP_INGRESS_DOMAIN": DOMAIN,
        **options.pop("cp_env", {}),
    }
    return start_platform(guest_dir, cp_env=cp_env, **options), port


def create_sandbox(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    body = {"shape": "s-1vcpu-256mb", "disk_mib": 2048, **fields}
    created = http.post("/v1/sandboxes", json=body)
    assert created.status_code == 200, created.text
    return dict(created.json()["data"])


def start_app(http: httpx.Client, sandbox_id: str, port: int = APP_PORT) -> None:
    """Uploads the app, starts it detached, and waits until it answers inside the sandbox."""
    put = http.put(
        f"/v1/sandboxes/{sandbox_id}/files", params={"path": "/srv/app.pl"}, content=APP.read_bytes()
    )
    assert put.status_code == 200, put.text
    started = http.post(
        f"/v1/sandboxes/{sandbox_id}/exec",
        json={
            "cmd": "bash",
            "args": ["-c", f"setsid perl /srv/app.pl {port} >/tmp/app.log 2>&1 </dev/null &"],
        },
    )
    assert started.status_code == 200, started.text
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        probe = http.post(
            f"/v1/sandboxes/{sandbox_id}/exec",
            json={"cmd": "curl", "args": ["-sf", f"http://127.0.0.1:{port}/hello"]},
        )
        if probe.status_code == 200 and probe.json()["data"]["result"]["stdout"].startswith("hello"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the app did not start in {sandbox_id}")


def ingress_host(sandbox_id: str, port: int = APP_PORT) -> str:
    return f"{port}-{sandbox_id}.{DOMAIN}"


def ingress_client(proxy_port: int, sandbox_id: str, port: int = APP_PORT, **options: Any) -> httpx.Client:
    """An httpx client that dials the proxy on 127.0.0.1 and names the sandbox in ``Host``.

    (curl resolves ``*.localhost`` to loopback by itself; Python's resolver does not.)
    """
    options.setdefault("timeout", 30)
    return httpx.Client(
        base_url=f"http://127.0.0.1:{proxy_port}",
        headers={"Host": f"{ingress_host(sandbox_id, port)}:{proxy_port}"},
        **options,
    )


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed wildcard certificate for ``*.sandbox.localhost`` (its own CA, for the client)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{DOMAIN}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{DOMAIN}")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "ingress.crt", directory / "ingress.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file
