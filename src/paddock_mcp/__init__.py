"""``paddock mcp``: Paddock's sandboxes as MCP tools, on the official ``mcp`` SDK (``pip install
'paddock[mcp]'``). ``build_server`` makes the server; ``paddock_cli`` runs it over stdio or streamable HTTP.
"""

from __future__ import annotations

from paddock_mcp.server import INSTRUCTIONS, TOOL_NAMES, build_server, run

__all__ = ["INSTRUCTIONS", "TOOL_NAMES", "build_server", "run"]
