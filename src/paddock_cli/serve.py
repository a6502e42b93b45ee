"""``paddock serve``: the whole platform on embedded defaults, as one supervised process tree.

    paddock serve
    ├── paddock controlplane   (API :8080, ingress proxy :8088, SSH gateway :2222, E2B API :3000 and
    │                           sandbox edge :49983, reconciler and workers)
    ├── paddock hostagent      (internal API :8081, runs sandboxes under the OCI runtime)
    └── paddock gateway        (API :8082, with a local dev chain)

Secrets shared between the children (the host token, the at-rest key) are generated once into
``$PADDOCK_DATA_DIR/secrets.env`` (mode 0600). A bootstrap user and API key are created on the first
run; the key is kept in ``$PADDOCK_DATA_DIR/bootstrap-api-key`` (0600) so it can be shown again. Every
start checks that key against the running control plane and makes a new one when its database does not
know it (the database was switched), before the gateway is started with it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from paddock_cli import localca
from paddock_core import statefiles

DATA_DIR = Path(os.environ.get("PADDOCK_DATA_DIR", "/var/lib/paddock"))
CP_PORT = int(os.environ.get("PADDOCK_CP_PORT", "8080"))
HOST_PORT = int(os.environ.get("PADDOCK_HOST_PORT", "8081"))
GW_PORT = int(os.environ.get("PADDOCK_GW_PORT", "8082"))
#: The ingress proxy runs inside the control plane; plain HTTP on loopback unless TLS is configured.
INGRESS_PORT = int(os.environ.get("PADDOCK_CP_INGRESS_PORT", "8088"))
INGRESS_DOMAIN = os.environ.get("PADDOCK_CP_INGRESS_DOMAIN", "sandbox.localhost")
#: The ingress's HTTPS listener (0: none); its certificate is the operator's or the local CA's.
INGRESS_TLS_PORT = int(os.environ.get("PADDOCK_CP_INGRESS_TLS_PORT", "8443"))
SSH_PORT = int(os.environ.get("PADDOCK_CP_SSH_PORT", "2222"))
#: The E2B-compatible API and the E2B sandbox edge, both inside the control plane (docs/e2b.md).
E2B_PORT = int(os.environ.get("PADDOCK_CP_E2B_PORT", "3000"))
E2B_EDGE_PORT = int(os.environ.get("PADDOCK_CP_E2B_EDGE_PORT", "49983"))
PRIVATE_UMASK = 0o077


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    health_url: str
    #: The child's umask: 0o077 for the services whose files are all private state (databases, keys).
    #: The host agent keeps the inherited one: it builds image trees and bundles sandboxes read.
    umask: int = -1
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)


def private_data_dir(data_dir: Path) -> Path:
    """The data directory holds databases, keys and sandbox records: the service user's alone (0700),
    also when an earlier version or an installer made it 0755."""
    statefiles.private_dir(data_dir)
    os.chmod(data_dir, statefiles.DIR_MODE)
    return data_dir


def load_or_create_secrets(data_dir: Path) -> dict[str, str]:
    path = data_dir / "secrets.env"
    values: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line:
                key, _, value = line.partition("=")
                values[key] = value
    changed = False
    for key in ("HOST_TOKEN", "SECRET_KEY"):
        if not values.get(key):
            values[key] = secrets.token_urlsafe(32)
            changed = True
    if changed:
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        os.chmod(path, 0o600)
    return values


def key_accepted(cp_url: str, key: str) -> bool:
    """Whether the running control plane knows ``key``; anything but a clear yes or no stops serve."""
    try:
        status = httpx.get(f"{cp_url}/v1/whoami", headers={"X-Api-Key": key}, timeout=10).status_code
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot check the bootstrap key against {cp_url}: {exc}") from exc
    if status in (401, 403):
        return False
    if status != 200:
        raise RuntimeError(f"cannot check the bootstrap key against {cp_url}: whoami answered {status}")
    return True


def bootstrap_key(data_dir: Path, env: dict[str, str], cp_url: str) -> str:
    """The bootstrap key, checked against the running control plane's database and provisioned when that
    database does not know it: a data directory first served on SQLite and then pointed at PostgreSQL
    (``PADDOCK_CP_DATABASE_URL``) keeps a key the new database never issued, and a gateway started
    with it would take payments for deploys the control plane then refuses."""
    path = data_dir / "bootstrap-api-key"
    if path.exists():
        saved = path.read_text().strip()
        if saved and key_accepted(cp_url, saved):
            return saved
        print(
            "serve: the saved bootstrap key is unknown to this control plane's database "
            "(was the database changed?); creating a new bootstrap user and key",
            file=sys.stderr,
        )
    key = create_bootstrap_key(env)
    if not key_accepted(cp_url, key):
        raise RuntimeError("the control plane refuses the bootstrap key it has just issued")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    os.chmod(path, 0o600)
    return key


def create_bootstrap_key(env: dict[str, str]) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "paddock_cli.main",
            "admin",
            "user",
            "create",
            "--name",
            "bootstrap",
            "--json",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return str(json.loads(out.stdout)["api_key"])


def available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def start_devchain(data_dir: Path) -> Path | None:
    """Start the local anvil chains for the gateway (idempotent); returns the devchain.json path."""
    if not available("paddock_gateway.devchain"):
        return None
    state = data_dir / "devchain"
    subprocess.run(
        [sys.executable, "-m", "paddock_gateway.devchain", "down", "--state-dir", str(state)],
        check=False,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "paddock_gateway.devchain", "up", "--state-dir", str(state)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return state / "devchain.json"


def ingress_env(base: dict[str, str], data_dir: Path | None = None) -> dict[str, str]:
    """Embedded ingress: plain HTTP on INGRESS_PORT (loopback) and HTTPS on INGRESS_TLS_PORT, with the
    operator's certificate and key (``PADDOCK_CP_INGRESS_TLS_CERT_FILE``/``_KEY_FILE``, a wildcard for
    the domain) or else the local CA's (``localca``, made once in the data dir); URLs are https.
    ``PADDOCK_CP_INGRESS_TLS_PORT=0`` keeps the ingress on plain HTTP only."""
    env = {"PADDOCK_CP_INGRESS_PORT": str(INGRESS_PORT), "PADDOCK_CP_INGRESS_DOMAIN": INGRESS_DOMAIN}
    operator = bool(
        base.get("PADDOCK_CP_INGRESS_TLS_CERT_FILE") and base.get("PADDOCK_CP_INGRESS_TLS_KEY_FILE")
    )
    if INGRESS_TLS_PORT and not operator and data_dir is not None:
        local = localca.ensure_local_ca(data_dir, INGRESS_DOMAIN)
        env["PADDOCK_CP_INGRESS_TLS_CERT_FILE"] = str(local.cert_file)
        env["PADDOCK_CP_INGRESS_TLS_KEY_FILE"] = str(local.key_file)
    tls = bool(INGRESS_TLS_PORT) and (operator or data_dir is not None)
    if tls:
        env["PADDOCK_CP_INGRESS_TLS_PORT"] = str(INGRESS_TLS_PORT)
    env["PADDOCK_CP_INGRESS_SCHEME"] = base.get("PADDOCK_CP_INGRESS_SCHEME", "https" if tls else "http")
    return env


def local_ca_file(data_dir: Path) -> Path | None:
    """The CA clients should trust for the ingress, when serve made it (not with an operator's cert)."""
    operator = os.environ.get("PADDOCK_CP_INGRESS_TLS_CERT_FILE")
    path = data_dir / "tls" / "ca.pem"
    return path if INGRESS_TLS_PORT and not operator and path.is_file() else None


def children(
    data_dir: Path, shared: dict[str, str], key: str = "", devchain: Path | None = None
) -> list[Child]:
    base = {k: v for k, v in os.environ.items()}
    cp_url = f"http://127.0.0.1:{CP_PORT}"
    cp_env = base | {
        "PADDOCK_CP_PORT": str(CP_PORT),
        "PADDOCK_CP_DATA_DIR": str(data_dir),
        "PADDOCK_CP_HOST_TOKEN": shared["HOST_TOKEN"],
        "PADDOCK_CP_SECRET_KEY": shared["SECRET_KEY"],
    }
    cp_env.update(ingress_env(base, data_dir))
    cp_env["PADDOCK_CP_SSH_PORT"] = str(SSH_PORT)  # the SSH gateway into sandboxes (sshgate.py)
    cp_env["PADDOCK_CP_E2B_PORT"] = str(E2B_PORT)  # the E2B-compatible API (e2b/)
    cp_env["PADDOCK_CP_E2B_EDGE_PORT"] = str(E2B_EDGE_PORT)
    host_env = base | {
        "PADDOCK_HOST_PORT": str(HOST_PORT),
        "PADDOCK_HOST_TOKEN": shared["HOST_TOKEN"],
        "PADDOCK_HOST_CONTROLPLANE_URL": cp_url,
        "PADDOCK_HOST_STATE_DIR": str(data_dir / "host"),
    }
    gw_env = base | {
        "PADDOCK_GW_PORT": str(GW_PORT),
        "PADDOCK_GW_DATA_DIR": str(data_dir),
        "PADDOCK_GW_CONTROLPLANE_URL": cp_url,
        "PADDOCK_GW_API_KEY": key,
    }
    if devchain is not None:
        gw_env["PADDOCK_GW_DEVCHAIN_FILE"] = str(devchain)
    run = [sys.executable, "-m", "paddock_cli.main"]
    procs = [Child("controlplane", [*run, "controlplane"], cp_env, f"{cp_url}/healthz", umask=PRIVATE_UMASK)]
    if available("paddock_hostagent.main"):
        procs.append(
            Child("hostagent", [*run, "hostagent"], host_env, f"http://127.0.0.1:{HOST_PORT}/healthz")
        )
    if available("paddock_gateway.main") and devchain is not None:
        procs.append(
            Child(
                "gateway",
                [*run, "gateway"],
                gw_env,
                f"http://127.0.0.1:{GW_PORT}/health",
                umask=PRIVATE_UMASK,
            )
        )
    return procs


async def wait_healthy(child: Child, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() < deadline:
            assert child.process is not None
            if child.process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.process.returncode}")
            try:
                if (await http.get(child.health_url)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{child.name} did not become healthy in {timeout_s:.0f}s")


def stop_all(procs: list[Child]) -> None:
    for child in reversed(procs):
        if child.process and child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    for child in reversed(procs):
        if child.process:
            try:
                child.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.process.kill()


def banner(key: str, ca_file: Path | None = None) -> str:
    cp = f"http://127.0.0.1:{CP_PORT}"
    https = ""
    if INGRESS_TLS_PORT:
        https = f"\n  ingress TLS    https://<port>-<sandbox id>.{INGRESS_DOMAIN}:{INGRESS_TLS_PORT}   (HTTP/1.1 over TLS)"
        if ca_file is not None:
            https += f"\n  ingress CA     {ca_file}   (trust it: curl --cacert, SSL_CERT_FILE, verify=)"
    return f"""
Paddock is running.
  control plane  {cp}        (OpenAPI: {cp}/docs)
  host agent     http://127.0.0.1:{HOST_PORT}   (internal)
  gateway        http://127.0.0.1:{GW_PORT}   (OpenAPI: http://127.0.0.1:{GW_PORT}/openapi.json)
  ingress        http://<port>-<sandbox id>.{INGRESS_DOMAIN}:{INGRESS_PORT}   (sandboxes with ingress_enabled){https}
  ssh            ssh -p {SSH_PORT} <sandbox id or name>@127.0.0.1   (keys: the sandbox's ssh_pubkeys)
  E2B API        http://127.0.0.1:{E2B_PORT}   (E2B_API_URL, and E2B_VOLUME_API_URL; docs/e2b.md)
  E2B sandboxes  http://127.0.0.1:{E2B_EDGE_PORT}  (E2B_SANDBOX_URL; E2B_API_KEY is the API key below)
  bootstrap API key: {key}

Try it:
  export PADDOCK_API_KEY={key}
  curl -s {cp}/v1/whoami -H "X-Api-Key: $PADDOCK_API_KEY"
  curl -s {cp}/v1/shapes
  curl -s -X POST {cp}/v1/sandboxes -H "X-Api-Key: $PADDOCK_API_KEY" \\
       -H 'Content-Type: application/json' -d '{{"shape":"s-1vcpu-1gb","ingress_enabled":true}}'
  # an app listening on port 3000 in that sandbox (the URL is its ingress_url_template):
  curl http://3000-<sandbox id>.{INGRESS_DOMAIN}:{INGRESS_PORT}/
  (curl resolves *.localhost to 127.0.0.1 itself; other clients: send that Host header to
   127.0.0.1:{INGRESS_PORT}, or curl --resolve 3000-<sandbox id>.{INGRESS_DOMAIN}:{INGRESS_PORT}:127.0.0.1)
Stop with Ctrl-C.
"""


def serve_embedded() -> int:
    private_data_dir(DATA_DIR)
    shared = load_or_create_secrets(DATA_DIR)
    devchain = start_devchain(DATA_DIR)
    procs = children(DATA_DIR, shared, "", devchain)
    key = ""
    if not any(child.name == "hostagent" for child in procs):
        print("serve: this build has no host agent; sandboxes cannot be created", file=sys.stderr)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        for child in procs:
            if child.name == "gateway":  # the key is checked against the control plane that now runs
                child.env["PADDOCK_GW_API_KEY"] = key
            child.process = subprocess.Popen(child.argv, env=child.env, umask=child.umask)
            asyncio.run(wait_healthy(child))
            if child.name == "controlplane":
                key = bootstrap_key(DATA_DIR, child.env, f"http://127.0.0.1:{CP_PORT}")
        print(banner(key, local_ca_file(DATA_DIR)), flush=True)
        while not stopping:
            for child in procs:
                assert child.process is not None
                if child.process.poll() is not None:
                    print(f"{child.name} exited with {child.process.returncode}; stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        stop_all(procs)
        if devchain is not None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "paddock_gateway.devchain",
                    "down",
                    "--state-dir",
                    str(devchain.parent),
                ],
                check=False,
                capture_output=True,
            )
