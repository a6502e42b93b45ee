"""The gateway's outside world, interfaces beside their implementations.

- ``hosting``: the interfaces only — ``HostingPlatform`` (projects and deployments, what the domain
  calls), ``SandboxProvider`` / ``Sandbox`` / ``TemplateProvider`` (what a hosting platform built on
  sandboxes needs) and their errors;
- ``sandbox_hosting``: ``SandboxHosting``, the ``HostingPlatform`` built on a ``SandboxProvider``;
- ``paddock_sandboxes``: ``PaddockSandboxProvider``, the ``SandboxProvider`` on the Paddock SDK;
- ``chain``: ``ChainClient``, the EVM chains over JSON-RPC;
- ``ingress``: ``IngressProbe``, a deployed app's public URL seen from the gateway.

The domain modules one level up import ``hosting`` and ``chain``; only ``app`` builds a hosting
implementation.
"""
