"""Where a request enters: the ``/v1`` API (``api``), the HTTP ingress to sandbox ports (``ingress``),
the E2B-compatible API and sandbox edge (``e2b``), the SSH gateway (``sshgate``), interactive terminals
(``terminals``) and what the OpenAPI document says beyond the routes (``contract``).

Edges parse and authenticate, then call the deciding modules in ``sandboxes``, ``resources`` and ``hosts``.
"""
