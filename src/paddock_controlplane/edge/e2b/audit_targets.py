"""Which of the E2B listeners' requests go into a sandbox's audit trail (``edge/auditing.py``), so an
agent on E2B's SDK leaves the trail an agent on ``/v1`` does (docs/audit.md):

- the E2B API's calls on one sandbox (``/sandboxes/{id}…``, ``/unstable/sandboxes/{id}/record``), under
  the caller's key or token id, named by E2B's routes; but not a read of its logs, which are read from
  the trail (``sandbox_logs``), as ``/v1``'s reads of the trail are not;
- the sandbox edge's calls on envd and the code interpreter, under ``envd`` (the sandbox's access
  token) or ``signed_url`` (a signed ``/files`` URL), named by their paths (``/process.Process/Start``,
  ``/files``, ``/execute``). A sandbox's other ports carry the user's own traffic, which the trail
  leaves out as it does the ingress's.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from paddock_controlplane.edge.auditing import Locate, Target
from paddock_controlplane.edge.e2b import identity
from paddock_controlplane.edge.e2b.edge.router import target_of
from paddock_controlplane.records import audit
from paddock_controlplane.records.services import Services
from paddock_core import fastlane

#: A call on one sandbox; ``version`` is the prefix of E2B's later routes.
API_PATH = re.compile(r"(?P<version>/v2|/unstable)?/sandboxes/(?P<sandbox_id>[^/]+)(?P<rest>/.*)?")
#: ``GET /sandboxes/metrics`` reads many sandboxes: it is on none.
NOT_A_SANDBOX = frozenset({"metrics"})
AUDITED_PORTS = frozenset({identity.ENVD_PORT, identity.INTERPRETER_PORT})


def api_target(scope: fastlane.Scope) -> Target | None:
    match = API_PATH.fullmatch(scope["path"])
    if match is None or match["sandbox_id"] in NOT_A_SANDBOX or match["rest"] == "/logs":
        return None  # a sandbox's logs are read from its trail: reading them would add to what they page
    rest = audit.bounded(match["rest"] or "", audit.MAX_PATH_CHARS)
    return Target(match["sandbox_id"], f"{match['version'] or ''}/sandboxes/{{sandbox_id}}{rest}")


def edge_locate(services: Services) -> Locate:
    def locate(scope: fastlane.Scope) -> Target | None:
        target = target_of(Request(scope), services)
        if target is None or target[1] not in AUDITED_PORTS or scope["path"] == "/health":
            return None
        path = audit.bounded(scope["path"], audit.MAX_PATH_CHARS)
        return Target(target[0], path, raw_body=target[1] == identity.ENVD_PORT and path == "/files")

    return locate
