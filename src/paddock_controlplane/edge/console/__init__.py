"""The web console: ``/console`` (``/`` redirects there), one static page and one small hand-written
script that call the public ``/v1`` API with the key the person signs in with (docs/console.md).

``mount_console(app)`` adds the routes to the control plane's app. The page, its script and its
stylesheet are served from this package; the terminal's xterm.js comes from npm at build time
(``console/``, ``npm ci`` then ``copy-vendor.mjs``) into ``static/vendor/``, never from a CDN.
"""

from paddock_controlplane.edge.console.pages import mount_console

__all__ = ["mount_console"]
