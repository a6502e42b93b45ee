"""Programs that run inside a sandbox, never in a Paddock server.

The control plane reads their text and runs it through the sandbox's exec path; nothing here is
imported. ``desktop_helper.py`` performs computer use (spec §12.3) inside a ``desktop:1`` sandbox,
whose packages ``paddock_core.rootfs`` lists.
"""
