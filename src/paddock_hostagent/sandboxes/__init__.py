"""The sandboxes of this host, one module per noun:

- ``registry``: what this host holds (entries, lookups, views, admission, records on disk);
- ``lifecycle``: create and fork (one path), pause, resume, resize, destroy, other tiers' sandboxes;
- ``networks``: private networks (bridges); ``disks``: S3 disks;
- ``commands``: exec and files; ``traffic``: egress allowlists and bandwidth;
- ``heartbeat``: what each beat reports, and the watch of guests and mounts between beats;
- ``checks``: refusals and error mapping; ``views``: the contract's views of a record;
- ``manager``: ``SandboxManager``, the one object the routes call, composing them.
"""

from paddock_hostagent.sandboxes.manager import SandboxManager

__all__ = ["SandboxManager"]
