"""E2B's own addressing, without ``E2B_SANDBOX_URL`` (which the SDK deprecates, to drop in its next major
version): the unmodified ``e2b`` SDK reaches a sandbox's envd at ``https://49983-<id>.<domain>``, the
domain the API tells it, which is Paddock's ingress over TLS; the ingress hands envd's and the code
interpreter's ports to the E2B edge of its process.

Only ``E2B_API_URL`` and ``E2B_API_KEY`` are set. The ingress has the certificate ``paddock serve``
makes, whose CA is trusted through ``SSL_CERT_FILE`` (both of the SDK's HTTP clients read it), and the
wildcard name resolves to 127.0.0.1 as a DNS record for it would: the test stands in for DNS, nothing
of the SDK is changed.

Signed file URLs (``download_url``/``upload_url``) open ``/files`` without the token, as envd's do: for
the path, user and operation signed, until their expiration."""

from __future__ import annotations

import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b_code_interpreter import Sandbox as CodeSandbox

from e2b import Sandbox
from paddock_cli.localca import ensure_local_ca
from paddock_hostagent.images import ImageStore
from tests.e2b.conftest import exported
from tests.hostagent.conftest import image_cache
from tests.live import LivePlatform, start_platform
from tests.network.ingress_support import DOMAIN
from tests.ports import free_port

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def platform(
    debian_image: Path, guest_binary_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LivePlatform, int, Path]]:
    # The CA and certificate ``paddock serve`` makes: what a user of it trusts with SSL_CERT_FILE.
    tls = ensure_local_ca(tmp_path_factory.mktemp("data"), DOMAIN)
    ca_file, cert_file, key_file = tls.ca_file, tls.cert_file, tls.key_file
    api_port, tls_port = free_port(), free_port()
    live = start_platform(
        guest_binary_dir,
        cp_env={
            "PADDOCK_CP_INGRESS_SCHEME": "https",
            "PADDOCK_CP_INGRESS_DOMAIN": DOMAIN,
            "PADDOCK_CP_INGRESS_TLS_PORT": str(tls_port),
            "PADDOCK_CP_INGRESS_TLS_CERT_FILE": str(cert_file),
            "PADDOCK_CP_INGRESS_TLS_KEY_FILE": str(key_file),
            "PADDOCK_CP_E2B_PORT": str(api_port),
            "PADDOCK_CP_E2B_EDGE_PORT": str(free_port()),
        },
    )
    try:
        yield live, api_port, ca_file
    finally:
        live.stop()


@pytest.fixture(scope="module")
def e2b_domain_env(platform: tuple[LivePlatform, int, Path]) -> Iterator[Path]:
    """The SDK's two variables, the certificate trusted, and ``*.sandbox.localhost`` resolving to
    loopback, for this module; everything as it was afterwards."""
    live, api_port, cert_file = platform
    variables = {
        "E2B_API_URL": f"http://127.0.0.1:{api_port}",
        "E2B_API_KEY": live.api_key(),
        "SSL_CERT_FILE": str(cert_file),
    }
    resolve = socket.getaddrinfo

    def wildcard_record(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith("." + DOMAIN):
            host = "127.0.0.1"
        return resolve(host, *args, **kwargs)

    socket.getaddrinfo = wildcard_record  # type: ignore[assignment]
    try:
        with exported(variables):
            yield cert_file
    finally:
        socket.getaddrinfo = resolve  # type: ignore[assignment]


@pytest.fixture(scope="module")
def sandbox(e2b_domain_env: Path) -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=300)
    try:
        yield made
    finally:
        made.kill()


def test_the_sdk_reaches_envd_at_e2bs_own_address_through_the_ingress(sandbox: Sandbox) -> None:
    assert sandbox.envd_api_url.startswith("https://49983-" + sandbox.sandbox_id + "." + DOMAIN + ":")
    assert sandbox.commands.run("echo $((6 * 7))").stdout == "42\n"  # a server-streaming Connect call
    sandbox.files.write("/tmp/domain.txt", "through the ingress")
    assert sandbox.files.read("/tmp/domain.txt") == "through the ingress"
    assert [entry.name for entry in sandbox.files.list("/tmp") if entry.name == "domain.txt"] == [
        "domain.txt"
    ]


def test_a_signed_url_opens_its_file_and_nothing_else(sandbox: Sandbox, e2b_domain_env: Path) -> None:
    """What ``download_url`` and ``upload_url`` give (a browser or another service, with no token) works
    for its own path and operation; a URL changed in any part, or past its expiration, is 401."""
    sandbox.files.write("/tmp/shared.txt", "signed for you")
    with httpx.Client(verify=str(e2b_domain_env), timeout=30) as anyone:
        read = sandbox.download_url("/tmp/shared.txt", use_signature_expiration=120)
        got = anyone.get(read)
        assert got.status_code == 200 and got.text == "signed for you", got.text

        write = sandbox.upload_url("/tmp/uploaded.txt")
        put = anyone.post(write, files={"file": ("uploaded.txt", b"sent without a token")})
        assert put.status_code == 200, put.text
        assert sandbox.files.read("/tmp/uploaded.txt") == "sent without a token"

        for changed in (
            _with(read, path="/etc/shadow"),  # another path
            _with(read, signature_expiration=str(int(time.time()) + 999)),  # a later expiration
            _with(read, signature=_with_last_char_changed(_query(read)["signature"])),
        ):
            refused = anyone.get(changed)
            assert refused.status_code == 401 and "signature" in refused.json()["message"], refused.text
        refused = anyone.get(_with(write))  # a write's signature does not read
        assert refused.status_code == 401, refused.text
        expired = sandbox.download_url("/tmp/shared.txt", use_signature_expiration=-1)
        refused = anyone.get(expired)
        assert refused.status_code == 401 and "expired" in refused.json()["message"], refused.text
        unsigned = anyone.get(_with(read, signature=None))
        assert unsigned.status_code == 401, unsigned.text


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def _with(url: str, **changes: str | None) -> str:
    parts = urllib.parse.urlsplit(url)
    query = _query(url)
    for name, value in changes.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def _with_last_char_changed(text: str) -> str:
    return text[:-1] + ("A" if text[-1] != "A" else "B")


def test_the_code_interpreter_is_reached_at_its_own_address_too(e2b_domain_env: Path) -> None:
    ImageStore(image_cache()).build("code-interpreter:1")  # cached after the first build
    code = CodeSandbox.create(timeout=300)
    try:
        assert code.run_code("x = 6 * 7\nx").text == "42"  # https://49999-<id>.<domain>/execute
    finally:
        code.kill()
