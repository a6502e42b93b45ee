"""What the gateway's OpenAPI document says beyond FastAPI's view of the routes (gateway spec §2.2, §5).

The routes already list their statuses (§5's table); ``paddock_core.openapi`` adds the error body to
each, the 404 of unknown ids and paths and the 500 any route may answer (§5), and drops FastAPI's 422,
which the gateway never sends.
"""

from __future__ import annotations

from paddock_core.openapi import GATEWAY_ERROR, Contract

CONTRACT = Contract(
    fail_schema=GATEWAY_ERROR,
    error_schema=GATEWAY_ERROR,
    success_schema=None,
    common_statuses=(500,),
)
