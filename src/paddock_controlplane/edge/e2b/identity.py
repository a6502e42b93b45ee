"""How Paddock's sandboxes and images are named in E2B's dialect, shared by the control API (``api``) and
the sandbox edge (``edge``), so the two agree on every value the SDK carries from one to the other.

- ``sandboxID`` is Paddock's sandbox id unchanged (``sb-01j…``): the edge routes ``E2b-Sandbox-Id`` and
  ``<port>-<id>.<domain>`` with it, and every ``/v1`` route takes it as is.
- ``templateID`` is the E2B template name the caller asked for (``base``, ``code-interpreter-v1``) or a
  Paddock image or template reference, which :func:`rootfs_for_template` maps to the image booted.
- ``clientID`` is a constant: E2B's names the cluster node, which a client never uses.
- ``envdVersion`` is what the edge serves (:data:`ENVD_VERSION`); the SDK switches features on by it.
- ``envdAccessToken`` is derived from the server's secret key and the sandbox id (:func:`envd_access_token`),
  so the edge checks ``X-Access-Token`` without a table and a restarted control plane hands out the same one.
- A volume's ``token`` is derived the same way from its id (:func:`volume_token`), under a key of its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from paddock_controlplane.settings import ControlPlaneSettings
from paddock_core.crypto import constant_time_equals, purpose_key

#: envd's port in E2B's sandbox addressing (``<port>-<id>.<domain>``, ``E2b-Sandbox-Port``), which the
#: edge serves itself (``edge/router.py``).
ENVD_PORT = 49983
#: The code interpreter's port, which the edge serves itself too.
INTERPRETER_PORT = 49999
#: The ports the edge serves for every sandbox, whatever listens there in it: through ``E2B_SANDBOX_URL``,
#: and through the ingress's ``<port>-<id>.<domain>`` names (E2B's own addressing, ``edge_address``).
EDGE_PORTS = frozenset({ENVD_PORT, INTERPRETER_PORT})

#: The envd protocol version the edge (``paddock_controlplane.edge.e2b.edge``) speaks. The SDK enables
#: features by it (``e2b.envd.versions``): 0.3.0 stdin for commands, 0.4.0 the default user, 0.5.2
#: ``envd`` close, 0.5.7 octet-stream uploads, 0.6.2 file metadata, 0.6.3 entry info in watch events,
#: 0.6.4 watching network mounts. Never claim a version whose features the edge does not serve.
#: The edge serves up to 0.5.7 (close stdin, octet-stream uploads); not 0.6.2's file metadata (xattrs).
#: 0.5.7 is the lowest version that turns on everything it serves below that; the versions are
#: cumulative, so entry info in watch events (0.6.3) waits for file metadata.
ENVD_VERSION = "0.5.7"

#: What ``clientID`` says (E2B's names the node; no client reads it).
CLIENT_ID = "paddock"

#: E2B's template names and the Paddock image each boots. Any other name is taken as a Paddock image or
#: template reference (``lifecycle.resolve_rootfs`` decides, and answers 400 naming ``rootfs``). E2B's
#: ``base`` (``e2bdev/base``) has Python with pip, Node.js with npm and git, and E2B code leans on them
#: (``commands.run("python3 …")``, ``sandbox.git``, a template's ``pip_install``): ``devbox:1`` has them,
#: ``debian:13`` (a shell and curl) does not. /v1's default stays ``debian:13``.
BASE_IMAGE = "devbox:1"
TEMPLATES: dict[str, str] = {
    "base": BASE_IMAGE,
    "code-interpreter-v1": "code-interpreter:1",
    "code-interpreter": "code-interpreter:1",
    "desktop": "desktop:1",
}
#: What a create without a template boots (E2B's default template).
DEFAULT_TEMPLATE = "base"


def rootfs_for_template(template_id: str) -> str:
    """The Paddock image reference a ``templateID`` boots."""
    return TEMPLATES.get(template_id, template_id)


def template_for_rootfs(rootfs: str) -> str:
    """The ``templateID`` shown for a sandbox booted from ``rootfs`` (created through ``/v1`` or E2B)."""
    for name, image in TEMPLATES.items():
        if image == rootfs:
            return name
    return rootfs


def domain(settings: ControlPlaneSettings) -> str:
    """The ``domain`` the SDK builds ``<port>-<sandboxID>.<domain>`` from when ``E2B_SANDBOX_URL`` is unset."""
    return settings.e2b_domain or settings.ingress_url_domain


def _key(settings: ControlPlaneSettings, purpose: bytes = b"paddock-e2b-envd-access-token") -> bytes:
    """The key of one kind of token, from the server's secret key (each kind its own: a sandbox's token
    never opens a volume whose id it shares nothing with, and the other way round)."""
    return purpose_key(settings.secret_key.get_secret_value(), purpose)


def envd_access_token(settings: ControlPlaneSettings, sandbox_id: str) -> str:
    """The ``envdAccessToken`` of a sandbox: the edge requires it in ``X-Access-Token``."""
    return "ea_" + hmac.new(_key(settings), sandbox_id.encode(), hashlib.sha256).hexdigest()


def check_envd_access_token(settings: ControlPlaneSettings, sandbox_id: str, presented: str) -> bool:
    """Whether ``presented`` is ``sandbox_id``'s token (constant time)."""
    return bool(presented) and constant_time_equals(presented, envd_access_token(settings, sandbox_id))


#: Where a request may carry a sandbox's token: envd's header, and the traffic token of its ports (the
#: SDK sends the same token in both).
TOKEN_HEADERS = ("x-access-token", "e2b-traffic-access-token")


def carries_token(settings: ControlPlaneSettings, sandbox_id: str, headers: Mapping[str, str]) -> bool:
    """Whether a request's ``headers`` carry ``sandbox_id``'s token in one of :data:`TOKEN_HEADERS`."""
    return any(check_envd_access_token(settings, sandbox_id, headers.get(name, "")) for name in TOKEN_HEADERS)


_VOLUME_TOKEN = b"paddock-e2b-volume-content-token"


def volume_token(settings: ControlPlaneSettings, volume_id: str) -> str:
    """A volume's ``token`` (E2B's ``VolumeAndToken``): the volume content API requires it as its
    ``Authorization: Bearer``. Derived like ``envdAccessToken``, so ``Volume.connect`` gets the same one
    from any control plane, and a deleted volume's id never comes back."""
    return "vt_" + hmac.new(_key(settings, _VOLUME_TOKEN), volume_id.encode(), hashlib.sha256).hexdigest()


def check_volume_token(settings: ControlPlaneSettings, volume_id: str, presented: str) -> bool:
    """Whether ``presented`` is ``volume_id``'s token (constant time)."""
    return bool(presented) and constant_time_equals(presented, volume_token(settings, volume_id))


def edge_address(settings: ControlPlaneSettings) -> tuple[str, int] | None:
    """Where the ingress of this process reaches the edge's listener (None: no edge here). A wildcard
    listen address is dialled on loopback."""
    if not settings.e2b_edge_port:
        return None
    host = settings.e2b_host or settings.host
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return host, settings.e2b_edge_port


#: What a signed file URL's signature says it may do, by the request's method (envd's signing).
SIGNED_OPERATIONS = {"GET": "read", "POST": "write"}


def file_signature(
    settings: ControlPlaneSettings,
    sandbox_id: str,
    path: str,
    operation: str,
    user: str,
    expiration: int | None,
) -> str:
    """The signature of a file URL, as the SDK's ``download_url``/``upload_url`` make it from the
    sandbox's ``envdAccessToken`` (envd's v1): ``v1_`` and the unpadded base64 of the SHA-256 of
    ``path:operation:user:token[:expiration]``, ``user`` empty for the default one."""
    fields = [path, operation, user, envd_access_token(settings, sandbox_id)]
    if expiration is not None:
        fields.append(str(expiration))
    digest = hashlib.sha256(":".join(fields).encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def check_file_signature(
    settings: ControlPlaneSettings,
    sandbox_id: str,
    *,
    method: str,
    path: str,
    user: str,
    signature: str,
    expiration: str | None,
    now: float,
) -> str | None:
    """Why a signed file URL does not open ``/files`` for ``method`` (None: it does): a signature made
    for another sandbox, path, user or operation, a changed expiration, or one in the past."""
    operation = SIGNED_OPERATIONS.get(method)
    if operation is None:
        return f"{method} /files is not signed"
    if expiration is not None and not (
        expiration.isascii() and expiration.isdigit() and len(expiration) <= 12
    ):
        return "signature_expiration: must be a Unix time in seconds"
    expires = int(expiration) if expiration is not None else None
    expected = file_signature(settings, sandbox_id, path, operation, user, expires)
    if not constant_time_equals(signature, expected):
        return "invalid signature"
    if expires is not None and expires < now:
        return "signature is already expired"
    return None
