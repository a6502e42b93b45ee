"""The E2B sandbox edge (``PADDOCK_CP_E2B_EDGE_PORT``; ``paddock serve`` opens 127.0.0.1:49983): the one
URL the SDK's ``E2B_SANDBOX_URL`` points at. It routes by ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` (or host
``<port>-<id>.<domain>``) and serves envd (port 49983: Connect-RPC ``process.Process`` and
``filesystem.Filesystem``, ``/files``, ``/health``) from Paddock's own guest and process manager, through
the same domain calls the ``/v1`` routes use. No E2B agent runs in the sandbox."""
