"""``paddock_core.tls.client_context``: one TLS context per process for the services' HTTP clients
(httpx loads the CA bundle again for every client it makes: ~50 ms of CPU for each host a control plane
links to). Shared, it still verifies as httpx would: a server whose CA ``SSL_CERT_FILE`` names is
trusted, the same server is refused once the variable is gone, and a changed variable makes a new
context. The server is a real TLS listener on 127.0.0.1 with a certificate from a CA made here."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from paddock_core import tls
from paddock_hostagent.client import HostAgentClient


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca_and_leaf(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate for 127.0.0.1 it signed: (ca.pem, leaf.pem, leaf-key.pem)."""
    now = dt.datetime.now(dt.UTC)
    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test CA"))
        .issuer_name(_name("test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "leaf.pem", directory / "leaf-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@pytest.fixture
async def https_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 answering every request 200 ``ok``; yields its URL and its CA."""
    ca, leaf, key = make_ca_and_leaf(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # a client that refused the certificate hangs up
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}", ca
    finally:
        server.close()
        await server.wait_closed()


async def get(url: str) -> str:
    async with httpx.AsyncClient(verify=tls.client_context(), timeout=10) as http:
        return (await http.get(url)).text


async def test_one_context_verifies_as_httpx_does_and_follows_ssl_cert_file(
    https_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ca = https_server
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    trusting = tls.client_context()
    assert tls.client_context() is trusting  # every client of the process shares it
    assert await get(url) == "ok"

    monkeypatch.delenv("SSL_CERT_FILE")  # certifi's bundle alone: this CA is unknown to it
    assert tls.client_context() is not trusting
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await get(url)

    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert await get(url) == "ok"


def test_the_host_agent_client_uses_the_shared_context() -> None:
    """The control plane's link to each host: no CA bundle loaded per host."""
    first, second = HostAgentClient("http://127.0.0.1:1", "t"), HostAgentClient("http://127.0.0.1:2", "t")
    contexts = {id(client._http._transport._pool._ssl_context) for client in (first, second)}  # type: ignore[attr-defined]
    assert contexts == {id(tls.client_context())}
