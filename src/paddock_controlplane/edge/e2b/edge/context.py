"""What every envd call carries once the router has checked it: the sandbox (running, its owner's), its
host link, and the E2B user the SDK named by Basic auth."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from starlette.requests import Request

from paddock_controlplane.edge.e2b.edge.connect import ConnectError
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records.models import Sandbox
from paddock_controlplane.records.services import Services
from paddock_core import errors

#: E2B's default user, the account its templates run as; Paddock's images need not have it.
DEFAULT_USER = "user"
#: The users the edge takes by Basic auth (E2B's two).
USERS = (DEFAULT_USER, "root")


@dataclass
class Call:
    services: Services
    sandbox: Sandbox
    link: hostlink.HostLinkAPI
    #: The E2B user the SDK named by Basic auth (``user`` or ``root``), or None when it named nobody
    #: (the SDK's default since envd 0.4.0): processes then run as the image's user. ``root`` runs as
    #: root, ``user`` as the sandbox's ``user`` account, or as the image's user where it has none
    #: (docs/e2b.md, Users).
    user: str | None
    #: Who the audit trail says made the call: ``envd`` (the sandbox's access token) or ``signed_url``.
    actor: str = "envd"


def audited_as(request: Request, sandbox: Sandbox, actor: str) -> None:
    """Files the request in the sandbox's audit trail under ``actor`` (``edge/auditing.py`` reads the
    state once it ends); a request refused before this is not filed, as a 401 on ``/v1`` is not."""
    request.state.user_id = sandbox.user_id
    request.state.key_id = actor


#: Paddock's errors in Connect's codes (the SDK maps those to its exceptions).
CODES: dict[int, str] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    413: "resource_exhausted",
    429: "resource_exhausted",
    501: "unimplemented",
    503: "unavailable",
    507: "resource_exhausted",
}


def as_connect(exc: errors.PaddockError) -> ConnectError:
    return ConnectError(CODES.get(exc.status, "internal"), exc.message)


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """The domain's and the host's failures as Connect errors."""
    try:
        yield
    except ConnectError:
        raise
    except hostlink.SandboxGoneError as exc:
        raise ConnectError("unavailable", f"the sandbox is no longer running: {exc}") from None
    except hostlink.HostError as exc:
        raise ConnectError("unavailable", f"the sandbox's host did not answer: {exc}") from None
    except errors.PaddockError as exc:
        raise as_connect(exc) from None
