"""Live-view links to a desktop sandbox's noVNC (spec §12.3 ``connect``): short-lived signed tokens.

``connect`` hands out ``<scheme>://<novnc port>-<sandbox id>.<ingress domain>/paddock-vnc/<token>/vnc.html``.
The ingress proxy (``ingress/proxy.py``) lets a request whose path starts with ``/paddock-vnc/<token>/``
through only while the token is valid for that sandbox and port, strips the prefix, and does so whether
or not the sandbox's ``ingress_enabled`` is on: the token is the permission. noVNC loads its assets and
opens its WebSocket relative to that path, so every request of the viewer carries the token. Without
it, the noVNC ports of a desktop sandbox are refused (401) even with ingress on.

A token is ``<sandbox id>.<port>.<expiry, unix s>.<HMAC-SHA256>``, keyed by the control plane's
``secret_key``, so every control-plane process checks what any of them signed, and nothing is stored.
A WebSocket opened before the expiry stays open; a new page load or reconnect needs a fresh link.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

from paddock_controlplane.settings import ControlPlaneSettings

PREFIX = "/paddock-vnc/"
NOVNC_BASE_PORT = 6080
MAX_SCREENS = 8
NOVNC_PORTS = range(NOVNC_BASE_PORT, NOVNC_BASE_PORT + MAX_SCREENS)
_DEV_KEY = "paddock-dev-insecure-key"


class TokenRefusedError(Exception):
    """The link is malformed, for another sandbox or port, forged, or expired."""


@dataclass(frozen=True)
class Grant:
    token: str
    expires_at_s: int


def _key(settings: ControlPlaneSettings) -> bytes:
    material = settings.secret_key.get_secret_value() or _DEV_KEY
    return hashlib.sha256(b"paddock-desktop-connect-v1:" + material.encode()).digest()


def _mac(settings: ControlPlaneSettings, message: str) -> str:
    digest = hmac.new(_key(settings), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue(settings: ControlPlaneSettings, sandbox_id: str, port: int, now_s: float | None = None) -> Grant:
    expires = int(now_s if now_s is not None else time.time()) + settings.desktop_connect_ttl_s
    message = f"{sandbox_id}.{port}.{expires}"
    return Grant(f"{message}.{_mac(settings, message)}", expires)


def check(settings: ControlPlaneSettings, token: str, sandbox_id: str, port: int) -> None:
    """Returns if ``token`` opens ``port`` of ``sandbox_id`` now; else TokenRefusedError saying why."""
    message, _, mac = token.rpartition(".")
    token_sandbox, _, rest = message.partition(".")
    port_text, _, expires_text = rest.partition(".")
    if not (mac and expires_text.isdigit() and port_text.isdigit()):
        raise TokenRefusedError("malformed live-view token")
    if not hmac.compare_digest(mac, _mac(settings, message)):
        raise TokenRefusedError("invalid live-view token")
    if token_sandbox != sandbox_id or int(port_text) != port:
        raise TokenRefusedError("this live-view token is for another sandbox or screen")
    if int(expires_text) < time.time():
        raise TokenRefusedError("this live-view link has expired; ask for a new one (connect)")


def split_path(target: str) -> tuple[str, str] | None:
    """``/paddock-vnc/<token>/rest?q`` -> (token, ``/rest?q``); None for any other request target."""
    if not target.startswith(PREFIX):
        return None
    token, slash, rest = target[len(PREFIX) :].partition("/")
    return token, slash + rest if slash else "/"
