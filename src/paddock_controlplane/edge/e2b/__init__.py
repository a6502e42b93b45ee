"""E2B compatibility: the unmodified E2B SDKs run against Paddock (docs/e2b.md).

``api`` is E2B's control API (sandboxes, templates) on its own listener (``listener``), calling the
control plane's domain functions as the ``/v1`` routes do; ``edge`` is the sandbox edge (envd, the code
interpreter, user ports); ``identity`` names Paddock's sandboxes and images in E2B's terms for both.
"""
