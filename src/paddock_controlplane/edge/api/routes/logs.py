"""A sandbox's logs (issue #35): ``GET /v1/sandboxes/{id}/logs?source=boot|guest&tail=N``.

``boot`` is what the sandbox's runtime and its guest's init wrote while it booted, with the host agent's
own lines about the boot; ``guest`` is a VM's serial console (a container has none: 409
``unsupported_on_tier``). Both are files the host agent keeps in the sandbox's slot on its host, read
from their end (``paddock_hostagent/logs.py``), so they are there while the sandbox is and go with it.
A managed process's output history is its ``connect?after=0`` stream (docs/observability.md).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from paddock_controlplane.edge.api.deps import SandboxPrincipalDep, ServicesDep
from paddock_controlplane.edge.api.routes.bodies import BoundaryRoute
from paddock_controlplane.hosts import hostlink
from paddock_controlplane.records import queries
from paddock_controlplane.records.states import BOOTED
from paddock_core import envelope, errors
from paddock_hostagent.schemas import MAX_LOG_TAIL_LINES

router = APIRouter(prefix="/v1/sandboxes", tags=["sandboxes"], route_class=BoundaryRoute)

DEFAULT_TAIL = 100


@router.get("/{sandbox_id}/logs")
async def get_logs(
    sandbox_id: str,
    principal: SandboxPrincipalDep,
    services: ServicesDep,
    source: Annotated[
        Literal["boot", "guest"],
        Query(description="boot: the runtime's and init's output while booting; guest: a VM's console"),
    ] = "boot",
    tail: Annotated[
        int, Query(ge=1, le=MAX_LOG_TAIL_LINES, description=f"the last N lines (default {DEFAULT_TAIL})")
    ] = DEFAULT_TAIL,
) -> dict[str, Any]:
    async with services.sessions() as session:
        sandbox = await queries.get_owned(session, principal.user_id, sandbox_id)  # 404 for anyone else's
    if sandbox.status not in BOOTED:
        raise errors.InvalidState(
            f"sandbox is {sandbox.status}: its logs are kept on its host while it is booted"
        )
    try:
        log = await (await hostlink.for_host(services, sandbox.host_id)).logs(sandbox_id, source, tail)
    except hostlink.SandboxGoneError:
        raise errors.InvalidState("the sandbox is gone from its host") from None
    except hostlink.HostError as exc:
        raise errors.Unavailable(f"the sandbox's host did not answer: {exc}") from None
    return envelope.success(
        {"sandbox_id": sandbox_id, "source": log.source, "lines": log.lines, "truncated": log.truncated}
    )
