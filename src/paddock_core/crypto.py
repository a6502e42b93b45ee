"""Secrets at rest: authenticated encryption with a configured key (Fernet: AES-128-CBC + HMAC-SHA256).

A database dump alone does not reveal webhook secrets, env values or disk credentials.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from cryptography.fernet import Fernet, InvalidToken


class SecretBox:
    def __init__(self, key_material: str) -> None:
        if not key_material:
            raise ValueError("an encryption key is required")
        derived = hashlib.sha256(b"paddock-secretbox-v1:" + key_material.encode()).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(derived))

    def seal(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def open(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken as exc:
            raise ValueError("secret cannot be decrypted with the configured key") from exc


def random_token(prefix: str, nbytes: int = 32) -> str:
    return prefix + secrets.token_urlsafe(nbytes)


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def constant_time_equals(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


#: What keys are derived from when the operator set no ``secret_key`` (development only).
DEV_SECRET = "paddock-dev-insecure-key"


def purpose_key(secret: str, purpose: bytes) -> bytes:
    """A key of one purpose from the server's secret (each purpose its own, so a token of one kind
    never opens another): SHA-256 of the purpose, a NUL and the secret."""
    return hashlib.sha256(purpose + b"\x00" + (secret or DEV_SECRET).encode()).digest()
