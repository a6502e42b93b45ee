"""The local certificate authority ``paddock serve`` (``make run``) makes once so the ingress speaks
HTTPS without an operator's certificate: a CA and a wildcard certificate for ``*.<ingress domain>``
(``*.sandbox.localhost``) that it signed, in ``$PADDOCK_DATA_DIR/tls/``. Clients trust ``ca.pem``
(``curl --cacert``, ``httpx.Client(verify=...)``, ``SSL_CERT_FILE``); the banner prints its path.

The CA's key never leaves that directory (0600 in a 0700 directory) and signs nothing else; the pair is
made again only when missing, for another domain, or within 30 days of expiry.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class LocalTLS:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _current(paths: LocalTLS, domain: str) -> bool:
    if not all(p.is_file() for p in (paths.ca_file, paths.cert_file, paths.key_file)):
        return False
    try:
        leaf = x509.load_pem_x509_certificate(paths.cert_file.read_bytes())
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    wanted = f"*.{domain}"
    fresh = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_BEFORE
    return fresh and wanted in names.get_values_for_type(x509.DNSName)


def ensure_local_ca(data_dir: Path, domain: str) -> LocalTLS:
    """The CA and the wildcard certificate for ``domain``, made on first use."""
    tls_dir = data_dir / "tls"
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(tls_dir, 0o700)
    paths = LocalTLS(tls_dir / "ca.pem", tls_dir / "ingress.pem", tls_dir / "ingress-key.pem")
    if _current(paths, domain):
        return paths
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Paddock local CA ({domain})")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(
            x509.NameConstraints(permitted_subtrees=[x509.DNSName(domain)], excluded_subtrees=None),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"*.{domain}")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{domain}")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write(paths.ca_file, ca.public_bytes(pem), 0o644)
    _write(paths.cert_file, leaf.public_bytes(pem) + ca.public_bytes(pem), 0o644)
    _write(
        paths.key_file,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    # The CA's own key is not kept: a new certificate means a new CA, so a stolen data dir cannot mint
    # certificates for other names, and the CA is name-constrained to the ingress domain anyway.
    del ca_key
    return paths
