"""The Paddock host agent: runs sandboxes on one machine and serves the internal API for the control plane.

The control plane imports only ``paddock_hostagent.client`` (httpx, no server dependencies).
"""
